/* mem_plan_act.c - element counts of the activation buffers the CPU trainer carves
 * (mem_plan_parts.h).  Each function mirrors one allocation site of trainer/model/ (named
 * in its comment); when those change, test_mem_plan fails until this follows. */
#include <string.h>

#include "shape/mem_plan_parts.h"

/* fa_take / ia_take round every buffer up to 16 elements (model/internal.h). */
static int64_t r16(int64_t n)
{
    return (n + 15) & ~(int64_t)15;
}

static void addf(mp_elems *el, mem_category k, int64_t n, int arena)
{
    el->f[k] += r16(n);
    if (arena)
        el->arena_floats += r16(n);
}

void mp_stack_init(mp_stack *st, const stack_shape *s, int tp, int sp, int E, int K, int Fm,
                   int Fs, int ep, int every)
{
    memset(st, 0, sizeof *st);
    st->s = s;
    st->tp = tp;
    st->H = s->hidden;
    st->D = s->head_dim;
    st->Hq = s->heads / tp;
    if (tp <= s->kv_heads) {
        st->Hkv = s->kv_heads / tp;
        st->kv_rep = 1;
    } else {
        st->Hkv = 1;
        st->kv_rep = tp / s->kv_heads;
    }
    st->QD = st->Hq * st->D;
    st->KD = st->Hkv * st->D;
    st->QKV = st->QD + 2 * st->KD;
    st->F = s->ffn / tp;
    st->Fu = s->mlp == MLP_SWIGLU ? 2 * st->F : st->F;
    st->E = E;
    st->K = E > 0 ? K : 0;
    st->Fm = E > 0 ? Fm : 0;
    st->Fs = E > 0 ? Fs : 0;
    st->ep = ep;
    st->El = E > 0 ? E / ep : 0;
    st->every = every > 0 ? every : 1;
    st->sp = sp && tp > 1;
    st->cp = 1;
    st->chunks = 1;
}

static int layer_moe(const mp_stack *st, int gl)
{
    return st->E > 0 && gl % st->every == st->every - 1;
}

/* Shared buffers under recomputation (block.c recompute_shared): bit i set = buffer i is
 * carved once for all layers. */
enum {
    SH_H1, SH_MEAN1, SH_RSTD1, SH_QR, SH_KR, SH_QRS, SH_KRS, SH_Q, SH_K, SH_V, SH_ATT,
    SH_LSE, SH_X1, SH_H2, SH_MEAN2, SH_RSTD2, SH_U, SH_A, SH_COUNT
};

typedef struct {
    mp_elems *el;
    mem_category cat;
    unsigned share, taken;
} take_state;

static void take(take_state *ts, int which, int64_t n)
{
    if (ts->share >> which & 1u) {
        if (ts->taken >> which & 1u)
            return;
        ts->taken |= 1u << which;
    }
    addf(ts->el, ts->cat, n, 1);
}

/* Attention on the qkv linear's rows in place (block.c qkv_in_place): one [N, QKV]
 * buffer per layer for q, k, v and one for their gradient, no split copies. */
static int qkv_rows(const mp_stack *st)
{
    return !st->s->qk_norm && st->s->pos == POS_LEARNED && st->cp == 1 && st->chunks == 1;
}

void mp_stack_arena(mp_elems *el, const mp_stack *st, int L, int first, int64_t N,
                    int64_t Nl, mem_category cat)
{
    const stack_shape *s = st->s;
    int qkn = s->qk_norm, any_moe = 0, any_dense = 0, rows = qkv_rows(st);
    int64_t n = N, nl = Nl, nk = N * st->K;
    take_state ts = { .el = el, .cat = cat };
    if (s->recompute == RECOMPUTE_FULL)
        ts.share = (1u << SH_COUNT) - 1;
    else if (s->recompute == RECOMPUTE_SELECTIVE)
        ts.share = 1u << SH_H1 | 1u << SH_H2 | 1u << SH_A;

    for (int l = 0; l <= L; l++)
        addf(el, cat, nl * st->H, 1);                       /* xs */
    for (int l = 0; l < L; l++) {
        take(&ts, SH_H1, n * st->H);
        take(&ts, SH_MEAN1, nl);
        take(&ts, SH_RSTD1, nl);
        if (qkn) {
            take(&ts, SH_QR, n * st->QD);
            take(&ts, SH_KR, n * st->KD);
            take(&ts, SH_QRS, n * st->Hq);
            take(&ts, SH_KRS, n * st->Hkv);
        }
        if (rows) {
            take(&ts, SH_Q, n * st->QKV);
        } else {
            take(&ts, SH_Q, n * st->QD);
            take(&ts, SH_K, n * st->KD);
            take(&ts, SH_V, n * st->KD);
        }
        take(&ts, SH_ATT, n * st->QD);
        take(&ts, SH_LSE, n * st->Hq);
        take(&ts, SH_X1, nl * st->H);
        take(&ts, SH_H2, n * st->H);
        take(&ts, SH_MEAN2, nl);
        take(&ts, SH_RSTD2, nl);
        if (layer_moe(st, first + l)) {
            /* moe.c moe_take: router, routing, expert rows (under ep the experts run on
             * the received rows instead, see mp_moe_exchange) */
            any_moe = 1;
            addf(el, MEM_MOE, n * st->E, 1);
            addf(el, MEM_MOE, n * st->E, 1);
            addf(el, MEM_MOE, st->E, 1);                    /* routed pairs over cp */
            addf(el, MEM_MOE, nk, 1);
            el->i[MEM_MOE] += r16(nk) + r16(st->E + 1) + r16(nk) + r16(nk);
            addf(el, MEM_MOE, nk * st->H, 1);
            if (st->ep <= 1) {
                addf(el, MEM_MOE, nk * 2 * st->Fm, 1);
                addf(el, MEM_MOE, nk * st->Fm, 1);
            }
            addf(el, MEM_MOE, nk * st->H, 1);
            if (st->ep > 1)
                el->i[MEM_MOE] += r16(2 * (int64_t)st->E) + r16(st->El + 1);
            if (st->Fs > 0) {
                addf(el, MEM_MOE, n * 2 * st->Fs, 1);
                addf(el, MEM_MOE, n * st->Fs, 1);
            }
        } else {
            any_dense = 1;
            take(&ts, SH_U, n * st->Fu);
            take(&ts, SH_A, n * st->F);
        }
    }
    /* the backward scratch shared by the layers (stack_scratch): qkv (or, with the rows
     * in place, dqkv), tmp, dq, dk, dv (with the rows in place: in dqkv) */
    addf(el, cat, n * st->QKV, 1);
    addf(el, cat, n * st->H, 1);
    if (!rows) {
        addf(el, cat, n * st->QD, 1);
        addf(el, cat, n * st->KD, 1);
        addf(el, cat, n * st->KD, 1);
    }
    if (qkn) {
        addf(el, cat, n * st->QD, 1);
        addf(el, cat, n * st->KD, 1);
    }
    addf(el, cat, n * st->QD, 1);
    int64_t wu = 0, wa = 0;
    if (any_dense) {
        wu = st->Fu;
        wa = st->F;
    }
    if (any_moe && st->Fs > 0) {
        if (2 * (int64_t)st->Fs > wu)
            wu = 2 * (int64_t)st->Fs;
        if (st->Fs > wa)
            wa = st->Fs;
    }
    addf(el, cat, n * wu, 1);
    addf(el, cat, n * wa, 1);
    if (any_moe) {
        /* moe_take_scratch */
        addf(el, MEM_MOE, nk * st->H, 1);
        if (st->ep <= 1) {
            addf(el, MEM_MOE, nk * st->Fm, 1);
            addf(el, MEM_MOE, nk * 2 * st->Fm, 1);
        }
        addf(el, MEM_MOE, nk * st->H, 1);
        addf(el, MEM_MOE, nk, 1);
        addf(el, MEM_MOE, n * st->E, 1);
        if (st->Fs > 0)
            addf(el, MEM_MOE, n * st->H, 1);
    }
    addf(el, cat, nl * st->H, 1);                           /* dres */
    if (st->sp)
        addf(el, cat, n * st->H, 1);                        /* dgat */
    if (st->cp > 1)
        addf(el, cat, 8 * n * st->KD, 1);                   /* the cp attention ring */
}

void mp_moe_exchange(mp_elems *el, const mp_stack *st, int L, int first, int64_t R)
{
    if (st->E == 0 || st->ep <= 1)
        return;
    int any = 0;
    for (int l = 0; l < L; l++)
        if (layer_moe(st, first + l)) {
            any = 1;
            el->f[MEM_MOE] += R * (st->H + 3 * (int64_t)st->Fm);
        }
    if (any)
        el->f[MEM_MOE] += R * (3 * (int64_t)st->H + 3 * (int64_t)st->Fm);
}

void mp_stage_buffers(mp_elems *el, const mp_stack *st, int has_head, int64_t N, int64_t Nf,
                      int64_t Nl, int64_t Vl, int64_t Vmax)
{
    /* decoder.c head_chunk: 2^22 (gpu: 2^30) floats of logits per chunk of the largest
     * slice */
    int64_t ch = (((int64_t)1 << (st->gpu ? 30 : 22)) / (Vmax > 0 ? Vmax : 1));
    if (ch < 1)
        ch = 1;
    if (ch > N)
        ch = N;
    int64_t n = N, nl = Nl, nf = Nf, half = st->D / 2;
    int sliced = st->cp > 1 || st->chunks > 1;
    /* decoder.c take.  Host arrays (which are device memory only on the cpu): ids,
     * targets, image rows, local rows, (cp: every cp rank's positions), sequence starts,
     * positions of the whole micro batch, target rows and targets, embedding and position
     * rows, image destinations; the RoPE tables of the micro batch (and the local rows
     * when sliced), the target rows' losses.  (N: the chunk's tokens under
     * parallel.chunks, Nf the micro batch's.) */
    if (!st->gpu) {
        el->i[MEM_STAGE] += 4 * r16(n) + (st->cp > 1 ? r16(st->cp * n) : 0) + r16(n + 1) +
                            r16(3 * nf) + r16(nf) + 4 * r16(n) + r16(nf);
        addf(el, MEM_STAGE, nf * half, 0);
        addf(el, MEM_STAGE, nf * half, 0);
        if (sliced) {
            addf(el, MEM_STAGE, n * half, 0);
            addf(el, MEM_STAGE, n * half, 0);
        }
        addf(el, MEM_LOGITS, n, 0);
    }
    /* Device copies of what kernels read: cp positions, sequence starts, target rows and
     * targets, embedding and position rows, image rows, image destinations, the local RoPE
     * rows; the tp partial embeddings; the learned-position rows. */
    el->i[MEM_STAGE] += (st->cp > 1 ? r16(st->cp * n) : 0) + r16(n + 1) + 5 * r16(n) +
                        r16(nf);
    addf(el, MEM_STAGE, n * half, 0);
    addf(el, MEM_STAGE, n * half, 0);
    if (st->tp > 1)
        addf(el, MEM_STAGE, n * st->H, 0);
    if (st->s->pos == POS_LEARNED)
        addf(el, MEM_STAGE, nl * st->H, 0);
    el->lse_doubles += n + 2 * ch;
    if (!has_head)
        return;
    addf(el, MEM_STAGE, n * st->H, 0);
    if (st->sp)
        addf(el, MEM_STAGE, nl * st->H, 0);
    addf(el, MEM_STAGE, nl, 0);
    addf(el, MEM_STAGE, nl, 0);
    addf(el, MEM_STAGE, n * st->H, 0);
    if (st->sp)
        addf(el, MEM_STAGE, nl * st->H, 0);
    addf(el, MEM_LOGITS, ch * st->H, 0);
    addf(el, MEM_LOGITS, ch * st->H, 0);
    el->logit_floats += r16(ch * Vl) + r16(n) + r16(ch);
}

void mp_encode_buffers(mp_elems *el, const mp_stack *st, const model_shape *m, int64_t P,
                       int64_t U)
{
    const encoder_shape *es = &m->encoder;
    int64_t merge2 = (int64_t)es->spatial_merge * es->spatial_merge;
    int64_t pin = (int64_t)es->s.hidden, ph = m->projector.hidden, out = m->decoder.s.hidden;
    int64_t pdim = (int64_t)es->in_channels * es->temporal_patch * es->patch * es->patch;
    mp_stack_arena(el, st, es->s.layers, 0, P, P, MEM_ENCODER);
    /* projector.c take, for U units of merge2 patches */
    int64_t Pu = U * merge2;
    addf(el, MEM_ENCODER, Pu * pin, 0);
    addf(el, MEM_ENCODER, Pu, 0);
    addf(el, MEM_ENCODER, Pu, 0);
    addf(el, MEM_ENCODER, U * ph, 0);
    addf(el, MEM_ENCODER, U * ph, 0);
    addf(el, MEM_ENCODER, U * out, 0);
    addf(el, MEM_ENCODER, U * out, 0);
    addf(el, MEM_ENCODER, U * ph, 0);
    addf(el, MEM_ENCODER, U * ph, 0);
    addf(el, MEM_ENCODER, Pu * pin, 0);
    /* encoder.c reserve: exact sizes (realloc) */
    el->f[MEM_ENCODER] += P * pdim + 2 * P * (es->s.head_dim / 2) + 2 * U * out;
    el->i[MEM_ENCODER] += 2 * P + 2 * P + P + (P + 1) + (P + 1);
}

int64_t mp_chunk_cache(mp_elems *el, const mp_stack *st, int L, int64_t N)
{
    if (st->chunks <= 1)
        return 0;
    /* decoder.c chunk_cache_begin: exact sizes (realloc), k, v, dk, dv of chunks 0 .. K-2
     * for every layer, and every chunk's positions */
    int64_t f = (int64_t)L * 4 * (st->chunks - 1) * N * st->KD;
    el->f[MEM_ACTIVATIONS] += f;
    el->i[MEM_STAGE] += (int64_t)st->chunks * N;
    return f;
}
