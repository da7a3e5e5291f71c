/* gpu_tap.h - the TAP harness of the GPU test programs (tests/gpu/test_*_gpu.cu): seed,
 * device probe and skip line, a pool of per-test allocations freed together, result
 * notes, kcuda return checks and the run-every-test loop.  Plain TAP (the GPU machine
 * lacks cmocka): a "# device ..." line, "1..N", then "ok N - name # note" per test;
 * tests/gpu/run.sh parses exactly this.  Test code only (C++: compiled by nvcc). */
#ifndef HEARTH_GPU_TAP_H
#define HEARTH_GPU_TAP_H

#include <stdarg.h>
#include <time.h>

#include "tests/gpu/gpu_util.h"


/* HEARTH_SEED=N replays a run; otherwise a fresh seed (never 0: xorshift would stay 0). */
static inline uint64_t gu_seed(void)
{
    const char *se = getenv("HEARTH_SEED");
    uint64_t seed = se ? strtoull(se, NULL, 10)
                       : ((uint64_t)time(NULL) * 2654435761u) ^ (uint64_t)clock();
    return seed ? seed : 1;
}

/* The number of CUDA devices; 0 (and the reason in *why) when there is none. */
static inline int gu_device_count(const char **why)
{
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        *why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
        return 0;
    }
    return ndev;
}

/* Without a CUDA device: prints the plan and one skipped test named `what`, returns 1. */
static inline int gu_skip_without_device(const char *what)
{
    const char *why = "";
    if (gu_device_count(&why) > 0)
        return 0;
    printf("1..1\nnot ok 1 - %s # SKIP no CUDA device (%s)\n", what, why);
    return 1;
}

/* The "# device: ..." first line with the seed; "none" when device 0 cannot be read. */
static inline void gu_device_line(uint64_t seed)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
        printf("# device: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor,
               (unsigned long long)seed);
    else
        printf("# device: none, seed %llu\n", (unsigned long long)seed);
}

/* ---- allocations of one test, freed together ------------------------------------- */

struct gu_pool {
    void *dev[128];
    int nd;
    void *host[128];
    int nh;
};

/* Adopt a device (gu_pd) or host (gu_ph) pointer; returns it, typed, so calls nest. */
template <typename T> static inline T *gu_pd(struct gu_pool *p, T *d)
{
    if (d && p->nd < 128)
        p->dev[p->nd++] = (void *)d;
    return d;
}

template <typename T> static inline T *gu_ph(struct gu_pool *p, T *h)
{
    if (h && p->nh < 128)
        p->host[p->nh++] = (void *)h;
    return h;
}

static inline void gu_pool_free(struct gu_pool *p)
{
    for (int i = 0; i < p->nd; i++)
        cudaFree(p->dev[i]);
    for (int i = 0; i < p->nh; i++)
        free(p->host[i]);
    p->nd = p->nh = 0;
}

static inline float *gu_hcopy(struct gu_pool *p, const float *h, size_t n)
{
    float *c = gu_ph(p, (float *)malloc((n ? n : 1) * sizeof *c));
    memcpy(c, h, n * sizeof *c);
    return c;
}

static inline float *gu_hzeros(struct gu_pool *p, size_t n)
{
    return gu_ph(p, (float *)calloc(n ? n : 1, sizeof(float)));
}

/* Device copy of the ints h[n], adopted by the pool; NULL on failure. */
static inline int *gu_iupload(struct gu_pool *p, const int *h, size_t n)
{
    int *d = NULL;
    if (gu_ck(cudaMalloc(&d, n * sizeof(int)), "cudaMalloc"))
        return NULL;
    gu_pd(p, d);
    if (gu_ck(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice), "upload int"))
        return NULL;
    return d;
}

/* ---- notes and checks ------------------------------------------------------------ */

/* Appends to t->note, the diagnostic printed after "# " on the test's TAP line. */
template <typename T>
static void gu_note(T *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
template <typename T> static void gu_note(T *t, const char *fmt, ...)
{
    size_t len = strlen(t->note);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->note + len, sizeof t->note - len, fmt, ap);
    va_end(ap);
}

/* A kcuda call returned success and the device has no asynchronous error; 1 = ok. */
static inline int gu_rc_ok(kcuda_ctx *k, int rc, const char *what)
{
    if (rc < 0) {
        printf("# %s returned %d: %s\n", what, rc, kcuda_ctx_errmsg(k));
        return 0;
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        printf("# %s: asynchronous error: %s\n", what, cudaGetErrorString(e));
        return 0;
    }
    return 1;
}

/* ---- the runner ------------------------------------------------------------------ */

template <typename T> struct gu_test {
    const char *name;
    int (*fn)(T *);
};

/* The whole main of a test program whose context T has members k (kcuda_ctx *), rng
 * (uint64_t) and note (char[]): skip without a device, seed, device line, context, one
 * TAP line per test (reset, when given, runs before each).  Returns the exit status. */
template <typename T> struct gu_same {
    typedef T type; /* keeps reset out of the template argument deduction */
};

template <typename T>
static int gu_tap_main(const char *what, const struct gu_test<T> *tests, int ntests, T *t,
                       void (*reset)(typename gu_same<T>::type *) = NULL)
{
    if (gu_skip_without_device(what))
        return 0;
    uint64_t seed = gu_seed();
    t->rng = seed;
    gu_device_line(seed);
    char err[256];
    int rc = kcuda_ctx_create(&t->k, NULL, 0, err, sizeof err);
    printf("1..%d\n", ntests);
    if (rc < 0) {
        printf("# %s\n", err);
        for (int i = 0; i < ntests; i++)
            printf("not ok %d - %s\n", i + 1, tests[i].name);
        return 1;
    }
    int failed = 0;
    for (int i = 0; i < ntests; i++) {
        t->note[0] = 0;
        if (reset)
            reset(t);
        int f = tests[i].fn(t);
        printf("%s %d - %s #%s\n", f ? "not ok" : "ok", i + 1, tests[i].name, t->note);
        if (f) {
            printf("# replay with HEARTH_SEED=%llu\n", (unsigned long long)seed);
            failed++;
        }
        fflush(stdout);
    }
    kcuda_ctx_free(t->k);
    return failed ? 1 : 0;
}

#endif
