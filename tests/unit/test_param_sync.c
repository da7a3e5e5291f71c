/* test_param_sync.c - gradient reduction, the global norm, AdamW (replicated and ZeRO-1)
 * and the gather of the full model, with ranks as threads on the local communicator.
 *
 * Every rank holds a single-rank model (model_create, same seed: identical replicas).  A
 * layout plus a per-rank "marking" of the tensors' shard fields simulates what a split
 * model would declare (tp-partial norms, kv-replicated qkv rows, tp-replicated tensors,
 * a tied embedding copy on the last stage, routed experts).  Each rank's gradients are
 * fresh random values; the test computes independently, from the rank coordinates and
 * the rules of param_sync.h (not from parallel_state or the module):
 *   - every reduced gradient: the sum over the ranks whose contribution reaches it;
 *   - the global norm: every element of the full model counted once;
 *   - the parameters after a few steps: kcpu_adamw_update per tensor on those summed
 *     gradients after clipping, as the single-rank trainer does, bit for bit: the clip
 *     factor comes from the module's norm once that norm has matched the reference's
 *     (a norm summed in another order may round the float factor to its neighbour, and
 *     AdamW, which steps by about lr * g / (|g| + eps), would pass such a difference on);
 *   - the gathered full model: the sum of the canonical writers' shards.
 * It checks that replicas end bitwise equal, frozen tensors are untouched, the
 * distributed optimizer gives the same parameters (bitwise where both runs' clip factors
 * agree, which they do unless their norms round differently), and a
 * rerun gives bitwise the same results. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>
#include <pthread.h>

#include "comm/comm.h"
#include "kernels.h"
#include "model/model.h"
#include "parallel/param_sync.h"
#include "parallel/parallel_state.h"
#include "support/testutil.h"
#include "test_model_util.h"
#include "train.h"

#define MAXW 8
#define SEED 1234

typedef struct job job;
/* Sets the shard fields of tensor t on the rank with coordinates (t, c, d, p). */
typedef void (*mark_fn)(model_tensor *t, const model_shape *sh, const ps_layout *l, int rank);

struct job {
    ps_layout l;
    model_shape shape;
    mark_fn mark;
    int zero, steps;
    float lr, wd, clip_max;
    size_t n;              /* parameters of one rank's model */
    float **grads;         /* [steps * world][n] inputs */
    float **reduced;       /* [steps * world][n] model gradients after each reduce */
    double *norm;          /* [steps * world] */
    float **params;        /* [world][n] after the last step */
    float **gathered;      /* [world][n] */
    float *init;           /* [n] the initial parameters (same on every rank) */
};

typedef struct {
    job *j;
    comm_world *w;
    int rank, rc;
    hearth_err err;
} rank_arg;

/* ---- the rules, written from the coordinates ------------------------------------------ */
typedef struct { int t, c, d, p, e, q; } coords;

static coords coords_of(const ps_layout *l, int r)
{
    coords k;
    k.t = r % l->tp;
    k.c = r / l->tp % l->cp;
    k.d = r / (l->tp * l->cp) % l->dp;
    k.p = r / (l->tp * l->cp * l->dp);
    k.e = k.d % l->ep;
    k.q = k.d / l->ep;
    return k;
}

static int is_encoder(const char *name)
{
    return !strncmp(name, "encoder.", 8) || !strncmp(name, "projector.", 10);
}

/* Ranks holding replicas of the same shard of tensor t as rank a. */
static int same_replica(const job *j, const model_tensor *t, int a, int b)
{
    coords x = coords_of(&j->l, a), y = coords_of(&j->l, b);
    if (is_encoder(t->name))
        return x.t % j->l.enc_tp == y.t % j->l.enc_tp &&
               (j->l.enc_strategy == ENC_FULL_SEPARATION || x.p == y.p);
    if (t->shard.expert)
        return x.t == y.t && x.p == y.p && x.e == y.e;
    return x.t == y.t && x.p == y.p;
}

/* Same component tensor-parallel group; within it, same kv group when kv > 1. */
static int same_tp(const job *j, const model_tensor *t, int a, int b, int kv)
{
    coords x = coords_of(&j->l, a), y = coords_of(&j->l, b);
    if (x.c != y.c || x.d != y.d || x.p != y.p)
        return 0;
    int etp = is_encoder(t->name) ? j->l.enc_tp : j->l.tp;
    if (x.t / etp != y.t / etp)
        return 0;
    return kv <= 1 || (x.t % etp) / kv == (y.t % etp) / kv;
}

static int tp_index(const job *j, const model_tensor *t, int r)
{
    coords x = coords_of(&j->l, r);
    return is_encoder(t->name) ? x.t % j->l.enc_tp : x.t;
}

static int tied_partner(const job *j, const model_tensor *t, int a, int b)
{
    coords x = coords_of(&j->l, a), y = coords_of(&j->l, b);
    int first = !strcmp(t->name, "decoder.embed.weight") && j->shape.decoder.tied_embeddings &&
                j->l.pp > 1;
    return first && x.t == y.t && x.c == y.c && x.d == y.d &&
           ((x.p == 0 && y.p == j->l.pp - 1) || (y.p == 0 && x.p == j->l.pp - 1));
}

/* The marked tensor table of rank r (every rank marks a fresh copy the same way). */
static void marked_table(const job *j, model *m, int r, model_tensor *out)
{
    for (int i = 0; i < model_tensor_count(m); i++) {
        out[i] = *model_tensor_at(m, i);
        if (j->mark)
            j->mark(&out[i], &j->shape, &j->l, r);
    }
}

/* Elements before the k and v rows (all of them for other tensors). */
static size_t q_elems(const model_tensor *t)
{
    return t->shard.kv_rep > 1 ? (size_t)(t->shard.seg_rows[0] * t->shard.ncols) : t->numel;
}

/* Whether rank b is in rank a's group of steps 1-3 (tp partial sums, the kv group for
 * the k and v rows, the tied pair) for row `row` of the local tensor; a itself always. */
static int in_pre(const job *j, const model_tensor *t, int a, int b, int64_t row)
{
    const model_shard *sh = &t->shard;
    int kv = sh->kv_rep > 1 && row >= sh->seg_rows[0] ? sh->kv_rep : 1;
    return b == a || (sh->tp_partial && same_tp(j, t, a, b, 1)) ||
           (kv > 1 && same_tp(j, t, a, b, kv)) || tied_partner(j, t, a, b);
}

/* The reduced gradient of tensor t on rank a, in the order of comm.h's reductions
 * (group-rank order = increasing world rank): each replica's sum over its steps 1-3
 * group, then the sum of those over the replicas.  Frozen: the rank's own gradient. */
static void expected_grad(const job *j, const model_tensor *t, int a, int st, float *out,
                          float *pre)
{
    int W = j->l.world;
    size_t nq = q_elems(t);
    memset(out, 0, t->numel * sizeof(float));
    for (int r2 = 0; r2 < W; r2++) {
        if (t->frozen ? r2 != a : !same_replica(j, t, a, r2))
            continue;
        memset(pre, 0, t->numel * sizeof(float));
        for (int b = 0; b < W; b++) {
            int cq = t->frozen ? b == r2 : in_pre(j, t, r2, b, 0);
            int ckv = t->frozen ? b == r2 : in_pre(j, t, r2, b, t->shard.seg_rows[0]);
            const float *g = j->grads[st * W + b] + t->offset;
            for (size_t e = 0; e < t->numel; e++)
                if (e < nq ? cq : ckv)
                    pre[e] += g[e];
        }
        for (size_t e = 0; e < t->numel; e++)
            out[e] += pre[e];
    }
}

/* Whether rank a is the canonical holder of row `row` of tensor t (norm and gather). */
static int canonical(const job *j, const model_tensor *t, int a, int64_t row)
{
    const model_shard *sh = &t->shard;
    for (int b = 0; b < a; b++)
        if (same_replica(j, t, a, b))
            return 0;   /* a lower rank holds the same replica */
    if (sh->tied_copy || (sh->tp_replicated && tp_index(j, t, a) != 0))
        return 0;
    if (sh->kv_rep > 1 && row >= sh->seg_rows[0] && tp_index(j, t, a) % sh->kv_rep)
        return 0;
    return 1;
}

/* ---- the ranks ------------------------------------------------------------------------ */
static void *rank_thread(void *p)
{
    rank_arg *a = p;
    job *j = a->j;
    int r = a->rank;
    comm *world = NULL;
    parallel_state *dec = NULL, *enc = NULL;
    model *m = NULL;
    param_sync *s = NULL;
    hearth_err *err = &a->err;
    int rc = comm_local_world_rank(a->w, r, &world, err);
    if (!rc)
        rc = parallel_state_create(&dec, &j->l, PS_DECODER, world, err);
    if (!rc)
        rc = parallel_state_create(&enc, &j->l, PS_ENCODER, world, err);
    if (!rc)
        rc = model_create(&m, &j->shape, SEED, err);
    if (!rc) {
        for (int i = 0; i < model_tensor_count(m) && j->mark; i++)
            j->mark((model_tensor *)model_tensor_at(m, i), &j->shape, &j->l, r);
        param_sync_opts o = { .distributed_optimizer = j->zero, .beta1 = TRAIN_ADAM_BETA1,
                              .beta2 = TRAIN_ADAM_BETA2, .eps = TRAIN_ADAM_EPS };
        rc = param_sync_create(&s, &m, 1, dec, enc, world, &o, err);
    }
    for (int st = 0; !rc && st < j->steps; st++) {
        int k = st * j->l.world + r;
        memcpy(model_grads(m), j->grads[k], j->n * sizeof(float));
        rc = param_sync_reduce(s, &j->norm[k], err);
        if (rc)
            break;
        memcpy(j->reduced[k], model_grads(m), j->n * sizeof(float));
        float clip = kcpu_clip_factor(j->norm[k], j->clip_max);
        rc = param_sync_step(s, st + 1, j->lr, j->wd, clip, err);
    }
    if (!rc)
        rc = param_sync_gather(s, m, j->gathered[r], err);
    if (!rc)
        memcpy(j->params[r], model_params(m), j->n * sizeof(float));
    a->rc = rc;
    param_sync_free(s);
    model_free(m);
    parallel_state_free(enc);
    parallel_state_free(dec);
    comm_free(world);
    return NULL;
}

static void job_init(job *j, const ps_layout *l, const model_shape *sh, mark_fn mark,
                     int steps, tu_rng *rng)
{
    memset(j, 0, sizeof *j);
    j->l = *l;
    j->shape = *sh;
    j->mark = mark;
    j->steps = steps;
    j->lr = 1e-3f;
    j->wd = 0.1f;
    model *m;
    hearth_err err;
    assert_int_equal(model_create(&m, sh, SEED, &err), 0);
    j->n = model_param_count(m);
    j->init = tu_fdup(model_params(m), j->n);
    model_free(m);
    int nk = steps * l->world;
    j->grads = calloc((size_t)nk, sizeof *j->grads);
    j->reduced = calloc((size_t)nk, sizeof *j->reduced);
    j->norm = tu_dalloc((size_t)nk);
    j->params = calloc((size_t)l->world, sizeof *j->params);
    j->gathered = calloc((size_t)l->world, sizeof *j->gathered);
    for (int k = 0; k < nk; k++) {
        j->grads[k] = tu_falloc(j->n);
        tu_fill_normal(rng, j->grads[k], j->n, 0.0f, 1.0f);
        j->reduced[k] = tu_falloc(j->n);
    }
    for (int r = 0; r < l->world; r++) {
        j->params[r] = tu_falloc(j->n);
        j->gathered[r] = tu_falloc(j->n);
    }
}

static void job_free(job *j)
{
    for (int k = 0; k < j->steps * j->l.world; k++) {
        free(j->grads[k]);
        free(j->reduced[k]);
    }
    for (int r = 0; r < j->l.world; r++) {
        free(j->params[r]);
        free(j->gathered[r]);
    }
    free(j->grads);
    free(j->reduced);
    free(j->params);
    free(j->gathered);
    free(j->norm);
    free(j->init);
}

static void job_run(job *j)
{
    comm_world *w;
    hearth_err err;
    comm_local_opts o = { .timeout_ms = 30000 };
    assert_int_equal(comm_local_world_create(&w, j->l.world, &o, &err), 0);
    pthread_t th[MAXW];
    rank_arg args[MAXW];
    for (int r = 0; r < j->l.world; r++) {
        args[r] = (rank_arg){ .j = j, .w = w, .rank = r };
        assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &args[r]), 0);
    }
    for (int r = 0; r < j->l.world; r++)
        pthread_join(th[r], NULL);
    comm_local_world_free(w);
    for (int r = 0; r < j->l.world; r++)
        if (args[r].rc)
            fail_msg("rank %d: %s", r, args[r].err.msg);
}

/* ---- the reference -------------------------------------------------------------------- */
/* Checks the run against the rules (see the top of the file). */
static void job_check(const job *j, tu_rng *rng)
{
    int W = j->l.world;
    assert_true(W >= 1 && W <= MAXW);
    size_t n = j->n;
    model *m;
    hearth_err err;
    assert_int_equal(model_create(&m, &j->shape, SEED, &err), 0);
    int nt = model_tensor_count(m);
    model_tensor *tab = calloc((size_t)(W * nt), sizeof *tab);
    for (int r = 0; r < W; r++)
        marked_table(j, m, r, tab + (size_t)r * nt);
    float *ref_p[MAXW], *ref_m[MAXW], *ref_v[MAXW], *sum[MAXW];
    for (int r = 0; r < W; r++) {
        ref_p[r] = tu_fdup(j->init, n);
        ref_m[r] = tu_falloc(n);
        ref_v[r] = tu_falloc(n);
        sum[r] = tu_falloc(n);
    }
    float *pre = tu_falloc(n);
    char what[200];
    for (int st = 0; st < j->steps; st++) {
        double ss = 0.0;
        for (int r = 0; r < W; r++) {
            for (int i = 0; i < nt; i++) {
                const model_tensor *t = &tab[(size_t)r * nt + i];
                size_t nq = q_elems(t);
                float *x = sum[r] + t->offset;
                expected_grad(j, t, r, st, x, pre);
                int canq = canonical(j, t, r, 0), cankv = canonical(j, t, r, t->shard.seg_rows[0]);
                for (size_t e = 0; e < t->numel; e++)
                    if (!t->frozen && (e < nq ? canq : cankv))
                        ss += (double)x[e] * x[e];
                /* Reduced gradients: without the distributed optimizer every element is
                 * the sum; with it only the rank's own part is, so it is checked through
                 * the parameters instead. */
                if (!j->zero && !t->frozen) {
                    snprintf(what, sizeof what, "step %d rank %d reduced %s", st + 1, r,
                             t->name);
                    TU_ASSERT_BITWISE(j->reduced[st * W + r] + t->offset, x, t->numel, rng,
                                      what);
                }
                if (t->frozen)
                    TU_ASSERT_BITWISE(j->reduced[st * W + r] + t->offset,
                                      j->grads[st * W + r] + t->offset, t->numel, rng,
                                      "frozen gradients untouched");
            }
        }
        double norm = sqrt(ss);
        for (int r = 0; r < W; r++) {
            snprintf(what, sizeof what, "step %d rank %d norm %.9g vs %.9g", st + 1, r,
                     j->norm[st * W + r], norm);
            TU_ASSERT_LE(fabs(j->norm[st * W + r] - norm) / norm, 1e-9, rng, what);
            assert_memory_equal(&j->norm[st * W + r], &j->norm[st * W], sizeof(double));
        }
        /* The module's norm, identical on every rank and checked above: with it the
         * reference clips exactly as the module does. */
        float clip = kcpu_clip_factor(j->norm[st * W], j->clip_max);
        for (int r = 0; r < W; r++)
            for (int i = 0; i < nt; i++) {
                const model_tensor *t = &tab[(size_t)r * nt + i];
                if (t->frozen)
                    continue;
                float *g = sum[r] + t->offset;
                if (clip != 1.0f)
                    kcpu_scale(g, t->numel, clip);
                kcpu_adamw_update(ref_p[r] + t->offset, g, ref_m[r] + t->offset,
                                  ref_v[r] + t->offset, t->numel, j->lr, TRAIN_ADAM_BETA1,
                                  TRAIN_ADAM_BETA2, TRAIN_ADAM_EPS, t->decay ? j->wd : 0.0f,
                                  st + 1);
            }
    }
    /* Parameters: bitwise the reference per tensor (the same reduced gradients, clip
     * factor and elementwise update: param_sync.h); frozen ones untouched; replicas
     * bitwise. */
    for (int r = 0; r < W; r++) {
        for (int i = 0; i < nt; i++) {
            const model_tensor *t = &tab[(size_t)r * nt + i];
            snprintf(what, sizeof what, "rank %d parameters of %s", r, t->name);
            if (t->frozen) {
                TU_ASSERT_BITWISE(j->params[r] + t->offset, j->init + t->offset, t->numel,
                                  rng, what);
                continue;
            }
            TU_ASSERT_BITWISE(j->params[r] + t->offset, ref_p[r] + t->offset, t->numel, rng,
                              what);
            for (int b = 0; b < r; b++)
                if (same_replica(j, t, r, b))
                    TU_ASSERT_BITWISE(j->params[r] + t->offset, j->params[b] + t->offset,
                                      t->numel, rng, what);
        }
    }
    /* Gather: the sum of the canonical writers' shards (whole shards here). */
    float *full = tu_falloc(n);
    for (int r = 0; r < W; r++)
        for (int i = 0; i < nt; i++) {
            const model_tensor *t = &tab[(size_t)r * nt + i];
            size_t nq = q_elems(t);
            int canq = canonical(j, t, r, 0), cankv = canonical(j, t, r, t->shard.seg_rows[0]);
            for (size_t e = 0; e < t->numel; e++)
                if (e < nq ? canq : cankv)
                    full[t->offset + e] += j->params[r][t->offset + e];
        }
    for (int r = 0; r < W; r++)
        TU_ASSERT_BITWISE(j->gathered[r], full, n, rng, "gathered full model");
    free(full);
    for (int r = 0; r < W; r++) {
        free(ref_p[r]);
        free(ref_m[r]);
        free(ref_v[r]);
        free(sum[r]);
    }
    free(pre);
    free(tab);
    model_free(m);
}

/* Runs the layout with the replicated and the distributed optimizer (and the latter
 * twice), checks each against the reference and compares them. */
static void run_both(const ps_layout *l, const model_shape *sh, mark_fn mark, int steps,
                     float clip_max)
{
    tu_rng rng = tu_rng_fresh_noted();
    job a, b;
    job_init(&a, l, sh, mark, steps, &rng);
    a.clip_max = clip_max;
    job_run(&a);
    job_check(&a, &rng);
    job_init(&b, l, sh, mark, steps, &rng);
    for (int k = 0; k < steps * l->world; k++)
        memcpy(b.grads[k], a.grads[k], a.n * sizeof(float));
    b.clip_max = clip_max;
    b.zero = 1;
    job_run(&b);
    job_check(&b, &rng);
    /* Both reduce bitwise the same gradients, but sum their norms in different orders:
     * the parameters are bitwise equal where every step's clip factor is (always without
     * clipping), and otherwise differ only through a last-bit difference of a factor. */
    int same_clip = 1;
    for (int st = 0; st < steps; st++)
        same_clip &= kcpu_clip_factor(a.norm[st * l->world], clip_max) ==
                     kcpu_clip_factor(b.norm[st * l->world], clip_max);
    for (int r = 0; r < l->world; r++) {
        if (same_clip)
            TU_ASSERT_BITWISE(b.params[r], a.params[r], a.n, &rng,
                              "distributed optimizer vs replicated (same clip factors)");
        else
            TU_ASSERT_LE(tu_rel_l2_ff(b.params[r], a.params[r], a.n), 1e-6, &rng,
                         "distributed optimizer vs replicated");
    }
    /* Rerun: bitwise the same. */
    float **keep = b.params;
    double *keep_norm = tu_dalloc((size_t)(steps * l->world));
    memcpy(keep_norm, b.norm, (size_t)(steps * l->world) * sizeof(double));
    b.params = calloc((size_t)l->world, sizeof *b.params);
    for (int r = 0; r < l->world; r++)
        b.params[r] = tu_falloc(b.n);
    job_run(&b);
    for (int r = 0; r < l->world; r++)
        TU_ASSERT_BITWISE(b.params[r], keep[r], b.n, &rng, "rerun parameters");
    assert_memory_equal(b.norm, keep_norm, (size_t)(steps * l->world) * sizeof(double));
    for (int r = 0; r < l->world; r++)
        free(keep[r]);
    free(keep);
    free(keep_norm);
    job_free(&a);
    job_free(&b);
}

/* ---- the layouts ---------------------------------------------------------------------- */
static ps_layout layout(int tp, int cp, int dp, int pp, int ep, encoder_strategy s, int etp)
{
    ps_layout l = { .world = tp * cp * dp * pp, .tp = tp, .cp = cp, .pp = pp, .dp = dp,
                    .ep = ep, .enc_strategy = s, .enc_tp = etp };
    return l;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* tp simulated on whole tensors: decoder norms partial and replicated (sequence
 * parallel), qkv with its k and v rows replicated over pairs of tp ranks (the encoder's
 * when its tp is even), encoder norms and the projector replicated, the patch embedding
 * partial but counted on every tp rank. */
static void mark_tp(model_tensor *t, const model_shape *sh, const ps_layout *l, int rank)
{
    (void)rank;
    model_shard *s = &t->shard;
    int dec = !strncmp(t->name, "decoder.", 8);
    if (dec && (ends_with(t->name, "norm.weight"))) {
        s->tp_partial = 1;
        s->tp_replicated = 1;
    } else if (strstr(t->name, "attn.qkv.") && (dec || l->enc_tp % 2 == 0)) {
        const stack_shape *st = dec ? &sh->decoder.s : &sh->encoder.s;
        int64_t q = (int64_t)st->heads * st->head_dim;
        int64_t kv = (int64_t)st->kv_heads * st->head_dim;
        s->nseg = 3;
        s->seg_row0[0] = 0;
        s->seg_rows[0] = q;
        s->seg_row0[1] = q;
        s->seg_rows[1] = kv;
        s->seg_row0[2] = q + kv;
        s->seg_rows[2] = kv;
        s->kv_rep = 2;
    } else if (!dec && (ends_with(t->name, "norm.weight") || ends_with(t->name, "norm.bias") ||
                        !strncmp(t->name, "projector.", 10))) {
        s->tp_replicated = 1;
    } else if (!strcmp(t->name, "encoder.patch_embed.weight")) {
        s->tp_partial = 1;
    }
}

/* Routed experts in the EDP group; the last stage's embedding is the tied copy. */
static void mark_pp_moe(model_tensor *t, const model_shape *sh, const ps_layout *l, int rank)
{
    (void)sh;
    if (strstr(t->name, ".mlp.experts."))
        t->shard.expert = 1;
    if (!strcmp(t->name, "decoder.embed.weight") && coords_of(l, rank).p == l->pp - 1)
        t->shard.tied_copy = 1;
}

static void test_dp_dense(void **state)
{
    (void)state;
    ps_layout l = layout(1, 1, 4, 1, 1, ENC_UNIFORM, 1);
    model_shape sh = tm_shape_vlm();
    run_both(&l, &sh, NULL, 3, 0.0f);
    run_both(&l, &sh, NULL, 2, 1.0f);   /* normal(0,1) gradients: always clipped */
}

static void test_dp_frozen_encoder_cp(void **state)
{
    (void)state;
    ps_layout l = layout(1, 2, 2, 1, 1, ENC_HETERO_DP, 1);
    model_shape sh = tm_shape_vlm();
    sh.encoder.s.freeze = 1;
    run_both(&l, &sh, NULL, 2, 1.0f);
}

static void test_tp_sim(void **state)
{
    (void)state;
    ps_layout l = layout(2, 1, 2, 1, 1, ENC_UNIFORM, 2);
    model_shape sh = tm_shape_vlm();
    run_both(&l, &sh, mark_tp, 2, 0.0f);
    run_both(&l, &sh, mark_tp, 2, 1.0f);
    /* The encoder's own, smaller tp group (hetero_tp) inside the decoder's, with cp. */
    l = layout(4, 2, 1, 1, 1, ENC_HETERO_TP, 2);
    run_both(&l, &sh, mark_tp, 2, 1.0f);
}

static void test_pp_tied_experts(void **state)
{
    (void)state;
    ps_layout l = layout(1, 1, 4, 2, 2, ENC_FULL_SEPARATION, 1);
    model_shape sh = tm_shape_vlm_moe();
    assert_true(sh.decoder.tied_embeddings);
    run_both(&l, &sh, mark_pp_moe, 2, 1.0f);
    sh.encoder.s.freeze = 1;
    run_both(&l, &sh, mark_pp_moe, 1, 0.0f);
}

/* The preset, with fewer layers to stay fast. */
static void test_preset_dp(void **state)
{
    (void)state;
    model_shape sh;
    hearth_err err;
    if (preset_load(&sh, "tiny-vlm", &err))
        fail_msg("%s", err.msg);
    sh.encoder.s.layers = 1;
    sh.encoder.n_full_attn = 0;
    sh.decoder.s.layers = 1;
    ps_layout l = layout(1, 1, 2, 1, 1, ENC_UNIFORM, 1);
    run_both(&l, &sh, NULL, 1, 1.0f);
}

/* Two local models per rank (virtual pipeline chunks), dp 2: both are synchronised, the
 * norm covers both, and the update of each matches the reference. */
typedef struct {
    comm_world *w;
    int rank, zero, rc;
    const model_shape *sh[2];
    float *g[2][2];        /* [rank][chunk] inputs */
    float *out[2][2];      /* [rank][chunk] parameters after one step */
    double norm[2];
    hearth_err err;
} chunks_arg;

static void *chunks_thread(void *p)
{
    chunks_arg *a = p;
    comm *world = NULL;
    parallel_state *dec = NULL, *enc = NULL;
    model *m[2] = { NULL, NULL };
    param_sync *s = NULL;
    ps_layout l = layout(1, 1, 2, 1, 1, ENC_UNIFORM, 1);
    param_sync_opts o = { .distributed_optimizer = a->zero, .beta1 = TRAIN_ADAM_BETA1,
                          .beta2 = TRAIN_ADAM_BETA2, .eps = TRAIN_ADAM_EPS };
    int rc = comm_local_world_rank(a->w, a->rank, &world, &a->err);
    if (!rc)
        rc = parallel_state_create(&dec, &l, PS_DECODER, world, &a->err);
    if (!rc)
        rc = parallel_state_create(&enc, &l, PS_ENCODER, world, &a->err);
    for (int c = 0; c < 2 && !rc; c++) {
        rc = model_create(&m[c], a->sh[c], SEED + c, &a->err);
        if (!rc)
            memcpy(model_grads(m[c]), a->g[a->rank][c], model_param_count(m[c]) * sizeof(float));
    }
    if (!rc)
        rc = param_sync_create(&s, m, 2, dec, enc, world, &o, &a->err);
    if (!rc)
        rc = param_sync_reduce(s, &a->norm[a->rank], &a->err);
    if (!rc)
        rc = param_sync_step(s, 1, 1e-2f, 0.1f, kcpu_clip_factor(a->norm[a->rank], 1.0f),
                             &a->err);
    for (int c = 0; c < 2 && !rc; c++)
        memcpy(a->out[a->rank][c], model_params(m[c]), model_param_count(m[c]) * sizeof(float));
    a->rc = rc;
    param_sync_free(s);
    model_free(m[0]);
    model_free(m[1]);
    parallel_state_free(enc);
    parallel_state_free(dec);
    comm_free(world);
    return NULL;
}

static void test_two_chunks(void **state)
{
    (void)state;
    tu_rng rng = tu_rng_fresh_noted();
    model_shape sh0 = tm_shape_vlm(), sh1 = tm_shape_gpt2();
    const model_shape *sh[2] = { &sh0, &sh1 };
    model *ref[2];
    hearth_err err;
    size_t n[2];
    for (int c = 0; c < 2; c++) {
        assert_int_equal(model_create(&ref[c], sh[c], SEED + c, &err), 0);
        n[c] = model_param_count(ref[c]);
    }
    chunks_arg a[2][2];   /* [zero][rank] */
    float *g[2][2], *out[2][2][2];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 2; c++) {
            g[r][c] = tu_falloc(n[c]);
            tu_fill_normal(&rng, g[r][c], n[c], 0.0f, 1.0f);
        }
    for (int z = 0; z < 2; z++) {
        comm_world *w;
        assert_int_equal(comm_local_world_create(&w, 2, NULL, &err), 0);
        pthread_t th[2];
        for (int r = 0; r < 2; r++) {
            memset(&a[z][r], 0, sizeof a[z][r]);
            a[z][r].w = w;
            a[z][r].rank = r;
            a[z][r].zero = z;
            for (int c = 0; c < 2; c++) {
                a[z][r].sh[c] = sh[c];
                for (int q = 0; q < 2; q++)
                    a[z][r].g[q][c] = g[q][c];
                out[z][r][c] = a[z][r].out[r][c] = tu_falloc(n[c]);
            }
            assert_int_equal(pthread_create(&th[r], NULL, chunks_thread, &a[z][r]), 0);
        }
        for (int r = 0; r < 2; r++)
            pthread_join(th[r], NULL);
        comm_local_world_free(w);
        for (int r = 0; r < 2; r++)
            if (a[z][r].rc)
                fail_msg("rank %d: %s", r, a[z][r].err.msg);
    }
    /* Reference: the summed gradients, the norm over both models, AdamW per tensor. */
    double ss = 0.0;
    float *sum[2];
    for (int c = 0; c < 2; c++) {
        sum[c] = tu_falloc(n[c]);
        for (size_t e = 0; e < n[c]; e++) {
            sum[c][e] = g[0][c][e] + g[1][c][e];
            ss += (double)sum[c][e] * sum[c][e];
        }
    }
    float clip = kcpu_clip_factor(sqrt(ss), 1.0f);
    for (int c = 0; c < 2; c++) {
        float *mm = tu_falloc(n[c]), *vv = tu_falloc(n[c]);
        for (int i = 0; i < model_tensor_count(ref[c]); i++) {
            const model_tensor *t = model_tensor_at(ref[c], i);
            kcpu_scale(sum[c] + t->offset, t->numel, clip);
            kcpu_adamw_update(model_params(ref[c]) + t->offset, sum[c] + t->offset,
                              mm + t->offset, vv + t->offset, t->numel, 1e-2f,
                              TRAIN_ADAM_BETA1, TRAIN_ADAM_BETA2, TRAIN_ADAM_EPS,
                              t->decay ? 0.1f : 0.0f, 1);
        }
        for (int z = 0; z < 2; z++)
            for (int r = 0; r < 2; r++) {
                TU_ASSERT_LE(fabs(a[z][r].norm[r] - sqrt(ss)) / sqrt(ss), 1e-9, &rng, "norm");
                TU_ASSERT_LE(tu_rel_l2_ff(out[z][r][c], model_params(ref[c]), n[c]), 1e-6,
                             &rng, "two chunks: parameters vs reference");
                TU_ASSERT_BITWISE(out[z][r][c], out[z][0][c], n[c], &rng, "replicas");
            }
        free(mm);
        free(vv);
        free(sum[c]);
        for (int z = 0; z < 2; z++)
            for (int r = 0; r < 2; r++)
                free(out[z][r][c]);
        for (int r = 0; r < 2; r++)
            free(g[r][c]);
        model_free(ref[c]);
    }
}

static void test_errors(void **state)
{
    (void)state;
    /* A step without a reduce is refused. */
    comm_world *w;
    hearth_err err;
    ps_layout l = layout(1, 1, 1, 1, 1, ENC_UNIFORM, 1);
    assert_int_equal(comm_local_world_create(&w, 1, NULL, &err), 0);
    comm *world;
    parallel_state *dec, *enc;
    model *m;
    param_sync *s;
    model_shape sh = tm_shape_vlm();
    assert_int_equal(comm_local_world_rank(w, 0, &world, &err), 0);
    assert_int_equal(parallel_state_create(&dec, &l, PS_DECODER, world, &err), 0);
    assert_int_equal(parallel_state_create(&enc, &l, PS_ENCODER, world, &err), 0);
    assert_int_equal(model_create(&m, &sh, SEED, &err), 0);
    assert_int_equal(param_sync_create(&s, &m, 1, dec, enc, world, NULL, &err), 0);
    assert_int_equal(param_sync_step(s, 1, 1e-3f, 0.0f, 1.0f, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "without a reduce"));
    param_sync_free(s);
    /* A tied copy without a pipeline is refused. */
    ((model_tensor *)model_tensor_find(m, "decoder.layers.0.mlp_norm.weight"))->shard.tied_copy = 1;
    assert_int_equal(param_sync_create(&s, &m, 1, dec, enc, world, NULL, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "tied copy"));
    assert_null(s);
    model_free(m);
    parallel_state_free(enc);
    parallel_state_free(dec);
    comm_free(world);
    comm_local_world_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dp_dense),
        cmocka_unit_test(test_dp_frozen_encoder_cp),
        cmocka_unit_test(test_tp_sim),
        cmocka_unit_test(test_pp_tied_experts),
        cmocka_unit_test(test_preset_dp),
        cmocka_unit_test(test_two_chunks),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
