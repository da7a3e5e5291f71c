/* gpt_gpu_profile.cu - the step's optional per-phase timing (gpt_gpu.h: gpt_gpu_profile*).
 *
 * While on, the step records one CUDA event at every change of the kind of work
 * (gg_prof_mark); the time from one event to the next belongs to the kind named at the
 * first, so the phases tile the stream's timeline and sum to the step's device time
 * (idle gaps included, charged to the phase they fall in).  GGP_IDLE marks the end of an
 * entry point: the time up to the next mark is not counted.  Events are folded into the
 * per-kind sums when the pool is full (a synchronisation, only while profiling) and at
 * gpt_gpu_profile_read.  While off, gg_prof_mark returns at once: no events, no syncs. */
#include <stdlib.h>

#include "gpu/gpt_gpu_internal.h"

#define GG_PROF_EVENTS 4096

struct gg_prof {
    cudaEvent_t ev[GG_PROF_EVENTS];
    int kind[GG_PROF_EVENTS];
    int n;                   /* events recorded and not folded yet */
    double ms[GGP_COUNT];
};

static const char *const names[GGP_COUNT] = {
    "embedding fwd",   "layernorm fwd",     "qkv gemm fwd",      "attention fwd",
    "proj gemm fwd",   "fc1 gemm fwd",      "gelu fwd",          "fc2 gemm fwd",
    "lm head fwd",     "cross-entropy fwd", "cross-entropy bwd", "lm head dinp",
    "lm head dW",      "layernorm bwd",     "fc2 dinp",          "fc2 dW",
    "fc1 dinp",        "fc1 dW",            "proj dinp",         "proj dW",
    "qkv dinp",        "qkv dW",            "bias grads",        "gelu bwd",
    "attention bwd",   "embedding bwd",     "zeroing (memset)",  "grad norm+clip",
    "adamw",           "layernorm dW/db",
};

const char *gpt_gpu_profile_name(int kind)
{
    return kind >= 0 && kind < GGP_COUNT ? names[kind] : NULL;
}

int gpt_gpu_profile_kinds(void) { return GGP_COUNT; }

/* Adds the intervals of the recorded events to the sums; keeps the last event as the
 * first of the pool (its interval is not complete yet). */
static int fold(gpt_gpu *g)
{
    gg_prof *p = g->prof;
    if (p->n == 0)
        return 0;
    int rc = gg_cuda(g, cudaEventSynchronize(p->ev[p->n - 1]), "profile sync");
    for (int i = 0; !rc && i + 1 < p->n; i++) {
        float ms = 0;
        if (p->kind[i] == GGP_IDLE)
            continue;
        rc = gg_cuda(g, cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]), "profile time");
        p->ms[p->kind[i]] += ms;
    }
    cudaEvent_t last = p->ev[p->n - 1];
    p->ev[p->n - 1] = p->ev[0];
    p->ev[0] = last;
    p->kind[0] = p->kind[p->n - 1];
    p->n = 1;
    return rc;
}

int gg_prof_mark(gpt_gpu *g, int kind)
{
    gg_prof *p = g->prof;
    int rc;
    if (!p)
        return 0;
    if (p->n == GG_PROF_EVENTS && (rc = fold(g)))
        return rc;
    if ((rc = gg_cuda(g, cudaEventRecord(p->ev[p->n], g->stream), "profile event")))
        return rc;
    p->kind[p->n++] = kind;
    return 0;
}

void gg_prof_free(gpt_gpu *g)
{
    if (!g->prof)
        return;
    for (int i = 0; i < GG_PROF_EVENTS; i++)
        if (g->prof->ev[i])
            cudaEventDestroy(g->prof->ev[i]);
    free(g->prof);
    g->prof = NULL;
}

int gpt_gpu_profile(gpt_gpu *g, int on)
{
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (!on) {
        if (g->prof)
            cudaStreamSynchronize(g->stream);   /* pending events before destroying them */
        gg_prof_free(g);
        return 0;
    }
    if (g->prof)
        return 0;
    g->prof = (gg_prof *)calloc(1, sizeof *g->prof);
    if (!g->prof)
        return gg_fail(g, KCUDA_ENOMEM, "out of host memory");
    for (int i = 0; i < GG_PROF_EVENTS; i++) {
        int rc = gg_cuda(g, cudaEventCreate(&g->prof->ev[i]), "profile events");
        if (rc) {
            gg_prof_free(g);
            return rc;
        }
    }
    return 0;
}

int gpt_gpu_profile_read(gpt_gpu *g, double *ms, int n)
{
    if (gg_no_device(g))
        return KCUDA_EARG;
    if (!g->prof)
        return gg_fail(g, KCUDA_EARG, "profiling is off (gpt_gpu_profile)");
    int rc = gg_prof_mark(g, GGP_IDLE);
    if (rc || (rc = fold(g)))
        return rc;
    g->prof->n = 0;
    for (int i = 0; i < GGP_COUNT; i++) {
        if (i < n)
            ms[i] = g->prof->ms[i];
        g->prof->ms[i] = 0;
    }
    return GGP_COUNT;
}
