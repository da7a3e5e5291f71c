/* kdev.c - the device object and the calls through its backend's table (kdev.h).
 *
 * The cpu backend is linked in; the cuda backend is a shared library loaded on the first
 * kdev_create(KDEV_CUDA) (kdev_backend.h says why), found as $HEARTH_CUDA_LIB, else
 * ../lib/libhearth_cuda.so beside the running program (build/bin -> build/lib, and
 * PREFIX/bin -> PREFIX/lib after make install), else by the dynamic loader's search. */
#include "kdev_backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_LIB "libhearth_cuda.so"

/* Candidate paths of the cuda backend, in order; returns how many were written. */
static int cuda_lib_paths(char paths[3][PATH_MAX])
{
    int n = 0;
    const char *env = getenv("HEARTH_CUDA_LIB");
    if (env && *env)
        snprintf(paths[n++], PATH_MAX, "%s", env);
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(paths[n++], PATH_MAX, "%.*s/../lib/%s", PATH_MAX - 32, exe, CUDA_LIB);
        }
    }
    snprintf(paths[n++], PATH_MAX, "%s", CUDA_LIB);
    return n;
}

int kdev_cuda_available(void)
{
    char paths[3][PATH_MAX];
    int n = cuda_lib_paths(paths);
    for (int i = 0; i < n; i++)
        if (strchr(paths[i], '/') ? access(paths[i], R_OK) == 0 : 0)
            return 1;
    /* A bare name is only found by loading it. */
    void *h = dlopen(CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
    if (h)
        dlclose(h);
    return h != NULL;
}

static int load_cuda(kdev *d, char *errbuf, size_t errlen)
{
    char paths[3][PATH_MAX], why[512] = "";
    int n = cuda_lib_paths(paths);
    for (int i = 0; i < n && !d->dl; i++) {
        d->dl = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (!d->dl && (strchr(paths[i], '/') == NULL || access(paths[i], F_OK) == 0))
            snprintf(why, sizeof why, "%s", dlerror());
    }
    if (!d->dl) {
        if (errbuf)
            snprintf(errbuf, errlen, "device cuda: this build has no CUDA backend (%s not "
                     "found: build with nvcc on PATH, or set HEARTH_CUDA_LIB)%s%s", CUDA_LIB,
                     *why ? "; " : "", why);
        return HERR_CONFIG;
    }
    const kdev_ops *(*entry)(void);
    *(void **)&entry = dlsym(d->dl, KDEV_CUDA_ENTRY_NAME);
    const kdev_ops *ops = entry ? entry() : NULL;
    if (!ops || ops->abi != KDEV_ABI) {
        if (errbuf)
            snprintf(errbuf, errlen, "device cuda: %s is not a Hearth backend of this "
                     "version (abi %d, want %d)", CUDA_LIB, ops ? ops->abi : -1, KDEV_ABI);
        return HERR_CONFIG;
    }
    d->ops = ops;
    return 0;
}

int kdev_create(kdev **out, kdev_kind kind, char *errbuf, size_t errlen)
{
    *out = NULL;
    kdev *d = calloc(1, sizeof *d);
    if (!d) {
        if (errbuf)
            snprintf(errbuf, errlen, "device: out of memory");
        return HERR_NOMEM;
    }
    d->kind = kind;
    int rc = 0;
    if (kind == KDEV_CPU)
        d->ops = kdev_cpu_ops();
    else if (kind == KDEV_CUDA)
        rc = load_cuda(d, errbuf, errlen);
    else {
        if (errbuf)
            snprintf(errbuf, errlen, "device: unknown kind %d", (int)kind);
        rc = HERR_ARG;
    }
    if (!rc && (rc = d->ops->init(d)) && errbuf)
        snprintf(errbuf, errlen, "device %s: %s", d->ops->name, d->errmsg);
    if (rc) {
        if (d->dl)
            dlclose(d->dl);
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void kdev_free(kdev *d)
{
    if (!d)
        return;
    free(d->prof);
    d->ops->fini(d);
    if (d->dl)
        dlclose(d->dl);
    free(d);
}

kdev_kind kdev_get_kind(const kdev *d)
{
    return d->kind;
}

const char *kdev_name(const kdev *d)
{
    return d->ops->name;
}

int kdev_status(const kdev *d)
{
    return d->status;
}

void kdev_status_clear(kdev *d)
{
    d->status = 0;
    d->errmsg[0] = '\0';
}

const char *kdev_errmsg(const kdev *d)
{
    return d->errmsg;
}

/* ---- profile ------------------------------------------------------------------------- */

#define PROF_OPS 64

typedef struct {
    const char *op;
    double ms;
    long calls;
} prof_op;

struct kdev_prof {
    const char *mark[KDEV_PROF_MARKS];   /* the op of each pending mark */
    int n;
    prof_op acc[PROF_OPS];
    int nacc;
    double ms[KDEV_PROF_MARKS];
};

/* Charges the pending marks' intervals to their ops; the last mark stays pending. */
static int prof_flush(kdev *d)
{
    struct kdev_prof *p = d->prof;
    if (p->n < 2)
        return 0;
    int rc = d->ops->prof_read(d, p->ms, p->n);
    if (rc)
        return rc;
    for (int i = 0; i < p->n - 1; i++) {
        int k = 0;
        while (k < p->nacc && p->acc[k].op != p->mark[i])
            k++;
        if (k == p->nacc) {
            if (p->nacc == PROF_OPS)
                continue;
            p->acc[p->nacc].op = p->mark[i];
            p->acc[p->nacc].ms = 0;
            p->acc[p->nacc++].calls = 0;
        }
        p->acc[k].ms += p->ms[i];
        p->acc[k].calls++;
    }
    p->mark[0] = p->mark[p->n - 1];
    p->n = 1;
    return 0;
}

/* Marks the start of an op (op: a string literal, compared by address). */
static void prof_mark(kdev *d, const char *op)
{
    struct kdev_prof *p = d->prof;
    if (p->n == KDEV_PROF_MARKS && prof_flush(d))
        return;
    if (d->ops->prof_mark(d, p->n) == 0)
        p->mark[p->n++] = op;
}

#define MARK(d, op)                                                                       \
    do {                                                                                  \
        if ((d)->prof)                                                                    \
            prof_mark((d), (op));                                                         \
    } while (0)

int kdev_profile_start(kdev *d)
{
    if (d->prof)
        return 0;
    d->prof = calloc(1, sizeof *d->prof);
    return d->prof ? 0 : kdev_fail(d, HERR_NOMEM, "profile: out of memory");
}

static int acc_cmp(const void *a, const void *b)
{
    double x = ((const prof_op *)a)->ms, y = ((const prof_op *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

double kdev_profile_report(kdev *d, char *buf, size_t len)
{
    struct kdev_prof *p = d->prof;
    if (!p)
        return kdev_fail(d, HERR_ARG, "profile: not started");
    prof_mark(d, "(end)");   /* closes the last op's interval */
    int rc = prof_flush(d);
    if (rc)
        return rc;
    qsort(p->acc, (size_t)p->nacc, sizeof p->acc[0], acc_cmp);
    double total = 0;
    for (int i = 0; i < p->nacc; i++)
        total += p->acc[i].ms;
    size_t off = 0;
    int w = snprintf(buf, len, "%-26s %8s %11s %7s\n", "op", "calls", "ms", "share");
    off = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < p->nacc && off < len; i++) {
        w = snprintf(buf + off, len - off, "%-26s %8ld %11.2f %6.1f%%\n", p->acc[i].op,
                     p->acc[i].calls, p->acc[i].ms, total > 0 ? 100 * p->acc[i].ms / total : 0);
        off += w > 0 ? (size_t)w : 0;
    }
    return total;
}

/* Keeps the first failure (kdev_status). */
static int note(kdev *d, int rc)
{
    if (rc && d->status == 0)
        d->status = rc;
    return rc;
}

int kdev_lib_version(const kdev *d, kdev_lib lib)
{
    return d->ops->lib_version(d, lib);
}

const char *kdev_hw_name(const kdev *d)
{
    return d->ops->hw_name(d);
}

int kdev_alloc(kdev *d, void **p, size_t bytes)
{
    *p = NULL;
    return note(d, d->ops->alloc(d, p, bytes));
}

void kdev_release(kdev *d, void *p)
{
    if (d && p)
        d->ops->release(d, p);
}

int kdev_upload(kdev *d, void *dst, const void *host, size_t bytes)
{
    MARK(d, "upload");
    return bytes ? note(d, d->ops->upload(d, dst, host, bytes)) : 0;
}

int kdev_download(kdev *d, void *host, const void *src, size_t bytes)
{
    MARK(d, "download");
    return bytes ? note(d, d->ops->download(d, host, src, bytes)) : 0;
}

int kdev_sync(kdev *d)
{
    MARK(d, "sync");
    return note(d, d->ops->sync(d));
}

size_t kdev_act_bytes(const kdev *d)
{
    return d->ops->act_bytes(d);
}

int kdev_alloc_act(kdev *d, void **p, size_t count)
{
    *p = NULL;
    return note(d, d->ops->alloc_act(d, p, count));
}

int kdev_act_copy_2d(kdev *d, float *dst, size_t dpitch, const float *src, size_t spitch,
                     size_t rows, size_t cols)
{
    MARK(d, "act_copy_2d");
    return note(d, d->ops->act_copy_2d(d, dst, dpitch, src, spitch, rows, cols));
}

int kdev_act_upload(kdev *d, void *dst, const float *host, size_t n)
{
    if (kdev_act_bytes(d) == sizeof(float))
        return kdev_upload(d, dst, host, n * sizeof(float));
    uint16_t *b = malloc(n ? n * sizeof *b : 1);
    if (!b)
        return note(d, kdev_fail(d, HERR_NOMEM, "act_upload: out of memory for %zu values", n));
    for (size_t i = 0; i < n; i++)
        b[i] = kcpu_bf16_encode(host[i]);
    int rc = kdev_upload(d, dst, b, n * sizeof *b);
    free(b);
    return rc;
}

int kdev_act_download(kdev *d, float *host, const void *src, size_t n)
{
    if (kdev_act_bytes(d) == sizeof(float))
        return kdev_download(d, host, src, n * sizeof(float));
    uint16_t *b = malloc(n ? n * sizeof *b : 1);
    if (!b)
        return note(d, kdev_fail(d, HERR_NOMEM, "act_download: out of memory for %zu values", n));
    int rc = kdev_download(d, b, src, n * sizeof *b);
    for (size_t i = 0; !rc && i < n; i++)
        host[i] = kcpu_bf16_decode(b[i]);
    free(b);
    return rc;
}

int kdev_set_precision(kdev *d, kdev_precision p)
{
    return note(d, d->ops->set_precision(d, p));
}

void kdev_mem_stats(const kdev *d, size_t *peak, size_t *current)
{
    size_t p = 0, c = 0;
    d->ops->mem_stats(d, &p, &c);
    if (peak)
        *peak = p;
    if (current)
        *current = c;
}

/* ---- the ops, straight through the table ---------------------------------------------- */

int kdev_copy(kdev *d, void *dst, const void *src, size_t bytes)
{
    MARK(d, "copy");
    return note(d, d->ops->copy(d, dst, src, bytes));
}

int kdev_copy_2d(kdev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t rows)
{
    MARK(d, "copy_2d");
    return note(d, d->ops->copy_2d(d, dst, dpitch, src, spitch, width, rows));
}

int kdev_zero(kdev *d, void *p, size_t bytes)
{
    MARK(d, "zero");
    return note(d, d->ops->zero(d, p, bytes));
}

int kdev_fill(kdev *d, float *x, size_t n, float value)
{
    MARK(d, "fill");
    return note(d, d->ops->fill(d, x, n, value));
}

int kdev_gather_rows(kdev *d, float *dst, const float *src, const int *idx, int n, int C)
{
    MARK(d, "gather_rows");
    return note(d, d->ops->gather_rows(d, dst, src, idx, n, C));
}

int kdev_scatter_rows(kdev *d, float *dst, const float *src, const int *idx, int n, int C)
{
    MARK(d, "scatter_rows");
    return note(d, d->ops->scatter_rows(d, dst, src, idx, n, C));
}

int kdev_add_bias(kdev *d, float *x, const float *bias, int n, int C)
{
    MARK(d, "add_bias");
    return note(d, d->ops->add_bias(d, x, bias, n, C));
}

int kdev_matmul_forward(kdev *d, float *out, const float *inp, const float *weight,
                        const float *bias, int M, int K, int N)
{
    return kdev_matmul_forward_residual(d, out, NULL, inp, weight, bias, M, K, N);
}

int kdev_matmul_forward_residual(kdev *d, float *out, const float *res, const float *inp,
                                 const float *weight, const float *bias, int M, int K, int N)
{
    MARK(d, "matmul_forward");
    return note(d, d->ops->matmul_forward(d, out, inp, weight, bias, res, M, K, N));
}

int kdev_matmul_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int M,
                         int K, int N)
{
    MARK(d, "matmul_backward");
    return note(d, d->ops->matmul_backward(d, dinp, dweight, dbias, dout, inp, weight, M, K, N,
                                           0));
}

int kdev_matmul_backward_set(kdev *d, float *dinp, float *dweight, float *dbias,
                             const float *dout, const float *inp, const float *weight, int M,
                             int K, int N)
{
    MARK(d, "matmul_backward");
    return note(d, d->ops->matmul_backward(d, dinp, dweight, dbias, dout, inp, weight, M, K, N,
                                           1));
}

int kdev_add(kdev *d, float *out, const float *a, const float *b, size_t n)
{
    MARK(d, "add");
    return note(d, d->ops->add(d, out, a, b, n));
}

int kdev_accumulate(kdev *d, float *dst, const float *src, size_t n)
{
    MARK(d, "accumulate");
    return note(d, d->ops->accumulate(d, dst, src, n));
}

int kdev_scale(kdev *d, float *x, size_t n, float s)
{
    MARK(d, "scale");
    return note(d, d->ops->scale(d, x, n, s));
}

int kdev_embedding_forward(kdev *d, float *out, const int *ids, const float *table, int N,
                           int C)
{
    MARK(d, "embedding_forward");
    return note(d, d->ops->embedding_forward(d, out, ids, table, N, C));
}

int kdev_embedding_backward(kdev *d, float *dtable, const float *dout, const int *ids,
                            int N, int C)
{
    MARK(d, "embedding_backward");
    return note(d, d->ops->embedding_backward(d, dtable, dout, ids, N, C));
}

int kdev_rmsnorm_forward(kdev *d, float *out, float *rstd, const float *inp,
                         const float *weight, int N, int C, float eps)
{
    MARK(d, "rmsnorm_forward");
    return note(d, d->ops->rmsnorm_forward(d, out, rstd, inp, weight, N, C, eps));
}

int kdev_rmsnorm_backward(kdev *d, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int N,
                          int C)
{
    MARK(d, "rmsnorm_backward");
    return note(d, d->ops->rmsnorm_backward(d, dinp, dweight, dout, inp, weight, rstd, N, C));
}

int kdev_layernorm_forward(kdev *d, float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C, float eps)
{
    MARK(d, "layernorm_forward");
    return note(d, d->ops->layernorm_forward(d, out, mean, rstd, inp, weight, bias, N, C, eps));
}

int kdev_layernorm_backward(kdev *d, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            const float *mean, const float *rstd, int N, int C)
{
    MARK(d, "layernorm_backward");
    return note(d, d->ops->layernorm_backward(d, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C));
}

int kdev_rope_forward(kdev *d, float *x, const float *cos, const float *sin, int N, int H,
                      int D)
{
    MARK(d, "rope_forward");
    return note(d, d->ops->rope_forward(d, x, cos, sin, N, H, D));
}

int kdev_rope_backward(kdev *d, float *dx, const float *cos, const float *sin, int N, int H,
                       int D)
{
    MARK(d, "rope_backward");
    return note(d, d->ops->rope_backward(d, dx, cos, sin, N, H, D));
}

int kdev_attention_forward(kdev *d, float *out, float *lse, const float *q, const float *k,
                           const float *v, const int *cu_seqlens, int nseq, int max_seqlen,
                           int N, int Hq, int Hkv, int D, int causal)
{
    return kdev_attention_forward_ld(d, out, lse, q, k, v, 0, 0, 0, cu_seqlens, nseq,
                                     max_seqlen, N, Hq, Hkv, D, causal);
}

int kdev_attention_forward_ld(kdev *d, float *out, float *lse, const float *q, const float *k,
                              const float *v, int ldq, int ldk, int ldv, const int *cu_seqlens,
                              int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                              int causal)
{
    MARK(d, "attention_forward");
    return note(d, d->ops->attention_forward(d, out, lse, q, k, v, ldq, ldk, ldv, cu_seqlens,
                                             nseq, max_seqlen, N, Hq, Hkv, D, causal));
}

int kdev_attention_backward(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v,
                            const float *out, const float *lse, const int *cu_seqlens,
                            int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                            int causal)
{
    MARK(d, "attention_backward");
    return note(d, d->ops->attention_backward(d, dq, dk, dv, dout, q, k, v, out, lse, 0, 0, 0,
                                              cu_seqlens, nseq, max_seqlen, N, Hq, Hkv, D,
                                              causal, 0));
}

int kdev_attention_backward_set(kdev *d, float *dq, float *dk, float *dv, const float *dout,
                                const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const int *cu_seqlens,
                                int nseq, int max_seqlen, int N, int Hq, int Hkv, int D,
                                int causal)
{
    return kdev_attention_backward_ld_set(d, dq, dk, dv, dout, q, k, v, out, lse, 0, 0, 0,
                                          cu_seqlens, nseq, max_seqlen, N, Hq, Hkv, D, causal);
}

int kdev_attention_backward_ld_set(kdev *d, float *dq, float *dk, float *dv,
                                   const float *dout, const float *q, const float *k,
                                   const float *v, const float *out, const float *lse, int ldq,
                                   int ldk, int ldv, const int *cu_seqlens, int nseq,
                                   int max_seqlen, int N, int Hq, int Hkv, int D, int causal)
{
    MARK(d, "attention_backward");
    return note(d, d->ops->attention_backward(d, dq, dk, dv, dout, q, k, v, out, lse, ldq, ldk,
                                              ldv, cu_seqlens, nseq, max_seqlen, N, Hq, Hkv, D,
                                              causal, 1));
}

int kdev_attention_block_forward(kdev *d, float *out, float *lse, const float *q,
                                 const float *k, const float *v, const int *q_cu,
                                 const int *q_pos, const int *k_cu, const int *k_pos,
                                 int nseq, int max_q, int max_k, int Hq, int Hkv, int D,
                                 int causal)
{
    MARK(d, "attention_block_forward");
    return note(d, d->ops->attention_block_forward(d, out, lse, q, k, v, q_cu, q_pos, k_cu, k_pos, nseq, max_q, max_k, Hq, Hkv, D, causal));
}

int kdev_attention_block_backward(kdev *d, float *dq, float *dk, float *dv,
                                  const float *dout, const float *q, const float *k,
                                  const float *v, const float *out, const float *lse,
                                  const int *q_cu, const int *q_pos, const int *k_cu,
                                  const int *k_pos, int nseq, int max_q, int max_k, int Hq,
                                  int Hkv, int D, int causal)
{
    MARK(d, "attention_block_backward");
    return note(d, d->ops->attention_block_backward(d, dq, dk, dv, dout, q, k, v, out, lse, q_cu, q_pos, k_cu, k_pos, nseq, max_q, max_k, Hq, Hkv, D, causal));
}

int kdev_swiglu_forward(kdev *d, float *out, const float *inp, int N, int F)
{
    MARK(d, "swiglu_forward");
    return note(d, d->ops->swiglu_forward(d, out, inp, N, F));
}

int kdev_swiglu_backward(kdev *d, float *dinp, const float *dout, const float *inp, int N,
                         int F)
{
    MARK(d, "swiglu_backward");
    return note(d, d->ops->swiglu_backward(d, dinp, dout, inp, N, F, 0));
}

int kdev_swiglu_backward_set(kdev *d, float *dinp, const float *dout, const float *inp, int N,
                             int F)
{
    MARK(d, "swiglu_backward");
    return note(d, d->ops->swiglu_backward(d, dinp, dout, inp, N, F, 1));
}

int kdev_gelu_forward(kdev *d, float *out, const float *inp, size_t n, kgelu_kind kind)
{
    MARK(d, "gelu_forward");
    return note(d, d->ops->gelu_forward(d, out, inp, n, kind));
}

int kdev_gelu_backward(kdev *d, float *dinp, const float *dout, const float *inp, size_t n,
                       kgelu_kind kind)
{
    MARK(d, "gelu_backward");
    return note(d, d->ops->gelu_backward(d, dinp, dout, inp, n, kind, 0));
}

int kdev_gelu_backward_set(kdev *d, float *dinp, const float *dout, const float *inp,
                           size_t n, kgelu_kind kind)
{
    MARK(d, "gelu_backward");
    return note(d, d->ops->gelu_backward(d, dinp, dout, inp, n, kind, 1));
}

int kdev_ce_rowmax(kdev *d, float *mx, const float *logits, int n, int Vl)
{
    MARK(d, "ce_rowmax");
    return note(d, d->ops->ce_rowmax(d, mx, logits, n, Vl));
}

int kdev_ce_rowsum(kdev *d, double *sums, const float *logits, const float *mx,
                   const int *targets, int v0, int n, int Vl)
{
    MARK(d, "ce_rowsum");
    return note(d, d->ops->ce_rowsum(d, sums, logits, mx, targets, v0, n, Vl));
}

int kdev_ce_grad(kdev *d, float *dlogits, const float *logits, const double *lse,
                 const int *targets, int v0, double dl, int n, int Vl)
{
    MARK(d, "ce_grad");
    return note(d, d->ops->ce_grad(d, dlogits, logits, lse, targets, v0, dl, n, Vl));
}

/* The LM head's composition (kdev.h): what the cpu backend is, and what a backend
 * without a fused path for the arguments gets. */
int kdev_head_ce_forward(kdev *d, float *ws, double *lse, float *losses, float *mx,
                         double *sums, const float *inp, const float *w, const int *targets,
                         int n, int K, int V)
{
    MARK(d, "head_ce_forward");
    int rc = d->ops->head_ce_forward(d, ws, lse, losses, mx, sums, inp, w, targets, n, K, V);
    if (rc != HERR_NOALGO)
        return note(d, rc);
    if ((rc = d->ops->matmul_forward(d, ws, inp, w, NULL, NULL, n, K, V)) ||
        (rc = d->ops->ce_rowmax(d, mx, ws, n, V)) ||
        (rc = d->ops->ce_rowsum(d, sums, ws, mx, targets, 0, n, V)))
        return note(d, rc);
    return note(d, d->ops->ce_finish(d, lse, losses, mx, sums, n));
}

int kdev_head_ce_backward(kdev *d, float *dinp, float *dw, float *ws, const double *lse,
                          const int *targets, double dl, const float *inp, const float *w,
                          int n, int K, int V)
{
    MARK(d, "head_ce_backward");
    int rc = d->ops->head_ce_backward(d, dinp, dw, ws, lse, targets, dl, inp, w, n, K, V);
    if (rc != HERR_NOALGO)
        return note(d, rc);
    if ((rc = d->ops->ce_grad(d, ws, ws, lse, targets, 0, dl, n, V)))
        return note(d, rc);
    return note(d, d->ops->matmul_backward(d, dinp, dw, NULL, ws, inp, w, n, K, V, 0));
}

int kdev_moe_router_forward(kdev *d, int *topk_idx, float *topk_w, float *probs, float *aux,
                            const float *logits, int N, int E, int K)
{
    MARK(d, "moe_router_forward");
    return note(d, d->ops->moe_router_forward(d, topk_idx, topk_w, probs, aux, logits, N, E, K));
}

int kdev_moe_router_backward(kdev *d, float *dlogits, const float *dtopk_w, float daux,
                             const float *probs, const int *topk_idx, const float *topk_w,
                             int N, int E, int K)
{
    MARK(d, "moe_router_backward");
    return note(d, d->ops->moe_router_backward(d, dlogits, dtopk_w, daux, probs, topk_idx, topk_w, N, E, K));
}

int kdev_moe_plan(kdev *d, int *offsets, int *row_src, int *slot_row, const int *topk_idx,
                  int N, int E, int K)
{
    MARK(d, "moe_plan");
    return note(d, d->ops->moe_plan(d, offsets, row_src, slot_row, topk_idx, N, E, K));
}

int kdev_moe_permute_forward(kdev *d, float *out, const float *inp, const int *row_src,
                             int N, int K, int C)
{
    MARK(d, "moe_permute_forward");
    return note(d, d->ops->moe_permute_forward(d, out, inp, row_src, N, K, C));
}

int kdev_moe_permute_backward(kdev *d, float *dinp, const float *dout, const int *row_src,
                              int N, int K, int C)
{
    MARK(d, "moe_permute_backward");
    return note(d, d->ops->moe_permute_backward(d, dinp, dout, row_src, N, K, C));
}

int kdev_moe_unpermute_forward(kdev *d, float *out, const float *expert_out,
                               const float *topk_w, const int *slot_row, int N, int K,
                               int C)
{
    MARK(d, "moe_unpermute_forward");
    return note(d, d->ops->moe_unpermute_forward(d, out, expert_out, topk_w, slot_row, N, K, C));
}

int kdev_moe_unpermute_backward(kdev *d, float *dexpert_out, float *dtopk_w,
                                const float *dout, const float *expert_out,
                                const float *topk_w, const int *slot_row, int N, int K,
                                int C)
{
    MARK(d, "moe_unpermute_backward");
    return note(d, d->ops->moe_unpermute_backward(d, dexpert_out, dtopk_w, dout, expert_out, topk_w, slot_row, N, K, C));
}

int kdev_amax(kdev *d, float *amax, const float *x, size_t n)
{
    MARK(d, "amax");
    return note(d, d->ops->amax(d, amax, x, n, 0));
}

int kdev_fp8_qdq(kdev *d, float *out, const float *x, size_t n, float scale, kfp8_format f)
{
    MARK(d, "fp8_qdq");
    return note(d, d->ops->fp8_qdq(d, out, x, n, scale, f));
}

/* The FP8 emulation (kdev.h): what the cpu backend is, and what a backend without an
 * FP8 GEMM for the arguments gets when the caller gave ws. */
int kdev_fp8_matmul_forward(kdev *d, float *ws, float *out, const float *inp, const float *w,
                            const float *bias, int M, int K, int N, float sx, float sw,
                            const kdev_fp8_amax *amax)
{
    MARK(d, "fp8_matmul_forward");
    int rc = d->ops->fp8_matmul_forward(d, ws, out, inp, w, bias, M, K, N, sx, sw, amax);
    if (rc != HERR_NOALGO)
        return note(d, rc);
    if (!ws)
        return HERR_NOALGO;         /* the caller's cue to give ws: not a failure */
    float *qx = ws, *qw = ws + (size_t)M * K;
    if ((amax && amax->x && (rc = d->ops->amax(d, amax->x, inp, (size_t)M * K, 1))) ||
        (amax && amax->w && (rc = d->ops->amax(d, amax->w, w, (size_t)N * K, 1))) ||
        (rc = d->ops->fp8_qdq(d, qx, inp, (size_t)M * K, sx, KFP8_E4M3)) ||
        (rc = d->ops->fp8_qdq(d, qw, w, (size_t)N * K, sw, KFP8_E4M3)))
        return note(d, rc);
    return note(d, d->ops->matmul_forward(d, out, qx, qw, bias, NULL, M, K, N));
}

int kdev_fp8_matmul_backward(kdev *d, float *ws, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, int M, int K, int N, float sx,
                             float sw, float sd, kfp8_format fd, const kdev_fp8_amax *amax)
{
    MARK(d, "fp8_matmul_backward");
    int rc = d->ops->fp8_matmul_backward(d, ws, dinp, dw, dout, inp, w, M, K, N, sx, sw, sd,
                                         fd, amax);
    if (rc != HERR_NOALGO)
        return note(d, rc);
    if (!ws)
        return HERR_NOALGO;
    size_t ny = (size_t)M * N, nx = (size_t)M * K;
    float *qd = ws, *qx = dw ? ws + ny : NULL, *qw = dinp ? ws + ny + (dw ? nx : 0) : NULL;
    if ((amax && amax->dy && (rc = d->ops->amax(d, amax->dy, dout, ny, 1))) ||
        (rc = d->ops->fp8_qdq(d, qd, dout, ny, sd, fd)) ||
        (qx && (rc = d->ops->fp8_qdq(d, qx, inp, nx, sx, KFP8_E4M3))) ||
        (qw && (rc = d->ops->fp8_qdq(d, qw, w, (size_t)N * K, sw, KFP8_E4M3))))
        return note(d, rc);
    return note(d, d->ops->matmul_backward(d, dinp, dw, NULL, qd, qx, qw, M, K, N, 0));
}

int kdev_adamw_update(kdev *d, float *param, const float *grad, float *m, float *v,
                      size_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, int step)
{
    MARK(d, "adamw_update");
    return note(d, d->ops->adamw_update(d, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, step));
}

int kdev_sumsq(kdev *d, double *out, const float *x, size_t n)
{
    MARK(d, "sumsq");
    return note(d, d->ops->sumsq(d, out, x, n));
}

int kdev_sumsq_multi(kdev *d, double *out, const float *const *x, const size_t *n, int count)
{
    MARK(d, "sumsq_multi");
    return note(d, d->ops->sumsq_multi(d, out, x, n, count));
}

int kdev_adamw_multi(kdev *d, const kdev_adamw_tensor *t, int count, float clip, float lr,
                     float beta1, float beta2, float eps, float weight_decay, int step)
{
    MARK(d, "adamw_multi");
    return note(d, d->ops->adamw_multi(d, t, count, clip, lr, beta1, beta2, eps, weight_decay,
                                       step));
}

int kdev_ce_finish(kdev *d, double *lse, float *losses, const float *mx, const double *sums,
                   int n)
{
    MARK(d, "ce_finish");
    return note(d, d->ops->ce_finish(d, lse, losses, mx, sums, n));
}
