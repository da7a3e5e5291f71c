/* test_model_stack_par.c - a transformer stack split by tensor, sequence and expert
 * parallelism (block.c, moe.c) against the same stack on one rank.
 *
 * A two-layer stack gets random full parameters, random inputs and a random output
 * gradient per micro batch.  The reference runs it unsplit: one forward and backward per
 * micro batch, gradients accumulating (what data parallelism over the ep ranks computes).
 * Then the layout runs as threads on the local communicator: rank (t, d) of tp x ep holds
 * the slice of every parameter that model_par.h assigns to tp rank t and ep rank d, cut
 * here by hand from the head, ffn and expert ranges (not with stack_cfg_split's numbers),
 * and runs micro batch d (its N/tp rows of the residual stream under sp).  Compared, each
 * to 1e-5 relative L2: every rank's output rows and input-gradient rows, the MoE aux loss,
 * and every parameter gradient, re-assembled into the full tensor: slices of tensors split
 * by tp summed in place (the k/v rows of a kv head shared by kv_rep ranks thus summed over
 * them), partial gradients (q/k norm; norms and row-parallel biases under sp) summed over
 * tp, replicated ones checked on every tp rank, and everything summed over the ep ranks
 * (their micro batches differ; expert slices land in disjoint rows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <math.h>

#include "comm/comm.h"
#include "model/internal.h"
#include "support/ranks.h"
#include "support/testutil.h"

#define L 2
#define MAXT 24         /* tensors per layer */
#define MAXR 8          /* ranks */
#define TOL 1e-5

typedef struct {
    const char *name;
    norm_kind norm;
    mlp_kind mlp;
    int bias, qk_norm;
    int H, heads, kv, D, F, N;
    int E, K, Fm, Fs;           /* E = 0: dense; else layer 1 is MoE, layer 0 dense */
    int tp, ep, sp;
    int bad_n;                  /* > 0: tp rank 1 runs this many tokens instead of N, so
                                   the collectives disagree and every rank must fail */
} layout;

/* How a tensor is cut over ranks. */
enum { CUT_NONE, CUT_QKV, CUT_PROJ, CUT_FC1, CUT_FC2, CUT_EXPERT };
/* How its gradients over the tp ranks combine into the full gradient. */
enum { RED_EACH, RED_SUM, RED_SP };

typedef struct {
    const char *name;           /* the block_params member */
    size_t off;                 /* offsetof(block_params, member) */
    int rows, cols;             /* full tensor as [rows, cols] */
    int cut, red;
    int init;                   /* 0 matrix, 1 norm weight (around 1), 2 bias */
} tdesc;

typedef struct {
    int row0[3], nrows[3], nseg;
    int col0, ncols;
} slice;

typedef struct {
    layout ly;
    stack_shape shape;
    tu_rng *rng;
    int nt[L];
    tdesc td[L][MAXT];
    /* full parameters and the reference gradients, per layer and tensor */
    float *full[L][MAXT], *gref[L][MAXT];
    /* micro batches (one per ep rank) */
    float *x[MAXR], *dy[MAXR], *cos[MAXR], *sin[MAXR];
    int cu[MAXR][17], nseq[MAXR];
    float *out_ref[MAXR], *dx_ref[MAXR];
    double aux_ref[MAXR];
    /* ranks */
    float *p[MAXR][L][MAXT], *g[MAXR][L][MAXT];
    float *out[MAXR], *dx[MAXR];
    double aux[MAXR];
    int rc[MAXR];
    hearth_err err[MAXR];
} tctx;

static int is_moe(const layout *ly, int l)
{
    return ly->E > 0 && l == 1;
}

static void add_t(tctx *x, int l, const char *name, size_t off, int rows, int cols, int cut,
                  int red, int init)
{
    x->td[l][x->nt[l]++] = (tdesc){ name, off, rows, cols, cut, red, init };
}

#define OFF(m) #m, offsetof(block_params, m)

static void build_descs(tctx *x)
{
    const layout *ly = &x->ly;
    int H = ly->H, QD = ly->heads * ly->D, QKV = QD + 2 * ly->kv * ly->D;
    int Fu = ly->mlp == MLP_SWIGLU ? 2 * ly->F : ly->F;
    int ln = ly->norm == NORM_LAYERNORM;
    for (int l = 0; l < L; l++) {
        x->nt[l] = 0;
        add_t(x, l, OFF(attn_norm_w), H, 1, CUT_NONE, RED_SP, 1);
        if (ln)
            add_t(x, l, OFF(attn_norm_b), H, 1, CUT_NONE, RED_SP, 2);
        add_t(x, l, OFF(qkv_w), QKV, H, CUT_QKV, RED_SUM, 0);
        if (ly->bias)
            add_t(x, l, OFF(qkv_b), QKV, 1, CUT_QKV, RED_SUM, 2);
        if (ly->qk_norm) {
            add_t(x, l, OFF(q_norm_w), ly->D, 1, CUT_NONE, RED_SUM, 1);
            add_t(x, l, OFF(k_norm_w), ly->D, 1, CUT_NONE, RED_SUM, 1);
        }
        add_t(x, l, OFF(proj_w), H, QD, CUT_PROJ, RED_SUM, 0);
        if (ly->bias)
            add_t(x, l, OFF(proj_b), H, 1, CUT_NONE, RED_SP, 2);
        add_t(x, l, OFF(mlp_norm_w), H, 1, CUT_NONE, RED_SP, 1);
        if (ln)
            add_t(x, l, OFF(mlp_norm_b), H, 1, CUT_NONE, RED_SP, 2);
        if (is_moe(ly, l)) {
            add_t(x, l, OFF(router_w), ly->E, H, CUT_NONE, RED_EACH, 0);
            add_t(x, l, OFF(exp_fc1_w), ly->E, 2 * ly->Fm * H, CUT_EXPERT, RED_EACH, 0);
            add_t(x, l, OFF(exp_fc2_w), ly->E, H * ly->Fm, CUT_EXPERT, RED_EACH, 0);
            if (ly->Fs > 0) {
                add_t(x, l, OFF(sh_fc1_w), 2 * ly->Fs, H, CUT_NONE, RED_EACH, 0);
                add_t(x, l, OFF(sh_fc2_w), H, ly->Fs, CUT_NONE, RED_EACH, 0);
            }
        } else {
            add_t(x, l, OFF(fc1_w), Fu, H, CUT_FC1, RED_SUM, 0);
            if (ly->bias)
                add_t(x, l, OFF(fc1_b), Fu, 1, CUT_FC1, RED_SUM, 2);
            add_t(x, l, OFF(fc2_w), H, ly->F, CUT_FC2, RED_SUM, 0);
            if (ly->bias)
                add_t(x, l, OFF(fc2_b), H, 1, CUT_NONE, RED_SP, 2);
        }
    }
}

/* The part of tensor d that tp rank t / ep rank e holds, from model_par.h. */
static slice cut_of(const layout *ly, const tdesc *d, int t, int e)
{
    slice s = { .nseg = 1, .nrows = { d->rows }, .ncols = d->cols };
    int tp = ly->tp, D = ly->D;
    int hq = ly->heads / tp, q0 = t * hq;
    int hkv = tp <= ly->kv ? ly->kv / tp : 1, kv0 = t * ly->kv / tp;
    int fl = ly->F / tp;
    switch (d->cut) {
    case CUT_QKV:
        s.nseg = 3;
        s.row0[0] = q0 * D;
        s.nrows[0] = hq * D;
        s.row0[1] = ly->heads * D + kv0 * D;
        s.nrows[1] = hkv * D;
        s.row0[2] = ly->heads * D + ly->kv * D + kv0 * D;
        s.nrows[2] = hkv * D;
        break;
    case CUT_PROJ:
        s.col0 = q0 * D;
        s.ncols = hq * D;
        break;
    case CUT_FC1:
        s.row0[0] = t * fl;
        s.nrows[0] = fl;
        if (ly->mlp == MLP_SWIGLU) {
            s.nseg = 2;
            s.row0[1] = ly->F + t * fl;
            s.nrows[1] = fl;
        }
        break;
    case CUT_FC2:
        s.col0 = t * fl;
        s.ncols = fl;
        break;
    case CUT_EXPERT:
        s.row0[0] = e * (ly->E / ly->ep);
        s.nrows[0] = ly->E / ly->ep;
        break;
    default:
        break;
    }
    return s;
}

static size_t slice_numel(const slice *s)
{
    size_t n = 0;
    for (int i = 0; i < s->nseg; i++)
        n += (size_t)s->nrows[i] * s->ncols;
    return n;
}

/* add = 0: loc = the slice of full; add = 1: full += loc in the slice. */
static void slice_copy(float *full, float *loc, const tdesc *d, const slice *s, int add)
{
    size_t k = 0;
    for (int i = 0; i < s->nseg; i++)
        for (int r = s->row0[i]; r < s->row0[i] + s->nrows[i]; r++)
            for (int c = s->col0; c < s->col0 + s->ncols; c++, k++) {
                float *f = full + (size_t)r * d->cols + c;
                if (add)
                    *f += loc[k];
                else
                    loc[k] = *f;
            }
}

static void attach(stack *st, float *p[L][MAXT], float *g[L][MAXT],
                   const tctx *x)
{
    for (int l = 0; l < L; l++) {
        block *b = &st->layers[l];
        b->moe = is_moe(&x->ly, l);
        for (int i = 0; i < x->nt[l]; i++) {
            *(float **)((char *)&b->p + x->td[l][i].off) = p[l][i];
            *(float **)((char *)&b->g + x->td[l][i].off) = g[l][i];
        }
    }
}

/* One forward + backward of micro batch d on a stack set up by the caller; rows
 * [row0, row0 + Nl) of the micro batch are this rank's. */
static int run_stack(tctx *x, stack *st, int d, int N, int row0, int Nl, float *out,
                     float *dx, double *aux, hearth_err *err)
{
    const layout *ly = &x->ly;
    int H = ly->H, rc;
    if ((rc = stack_reserve(st, N, err)))
        return rc;
    memcpy(st->xs[0], x->x[d] + (size_t)row0 * H, (size_t)Nl * H * sizeof(float));
    /* (a bad_n rank: one sequence of its N tokens) */
    int one[2] = { 0, N }, mine = N == ly->N;
    stack_ctx ctx = { .N = N, .N_local = Nl, .cos = x->cos[d], .sin = x->sin[d],
                      .cu = mine ? x->cu[d] : one, .nseq = mine ? x->nseq[d] : 1,
                      .cu_full = mine ? x->cu[d] : one, .nseq_full = mine ? x->nseq[d] : 1 };
    if ((rc = stack_forward(st, &ctx, aux, err)))
        return rc;
    memcpy(out, st->xs[L], (size_t)Nl * H * sizeof(float));
    memcpy(st->sc.dres, x->dy[d] + (size_t)row0 * H, (size_t)Nl * H * sizeof(float));
    if ((rc = stack_backward(st, &ctx, 0.25f, err)))
        return rc;
    memcpy(dx, st->sc.dres, (size_t)Nl * H * sizeof(float));
    return 0;
}

static void init_cfg(const tctx *x, stack_cfg *c, kdev *dev)
{
    const layout *ly = &x->ly;
    stack_cfg_init(c, dev, &x->shape, 1, ly->E, ly->E ? ly->K : 0, ly->E ? ly->Fm : 0,
                   ly->E ? ly->Fs : 0);
}

/* Rank r = d * tp + t: tp rank t of data (expert-parallel) rank d. */
static int rank_main(void *ctx, int r, comm *world, hearth_err *err)
{
    tctx *x = ctx;
    const layout *ly = &x->ly;
    ranks_grid g;
    ranks_grid_place(&g, r, ly->tp, ly->ep);
    int t = g.t, d = g.e;
    comm *tpc = NULL, *epc = NULL;
    stack st;
    memset(&st, 0, sizeof st);
    int rc = ranks_grid_groups(&g, world, &tpc, &epc, err);
    stack_cfg c;
    kdev *dev = NULL;   /* each rank thread its own device */
    if (!rc && kdev_create(&dev, KDEV_CPU, err->msg, sizeof err->msg))
        rc = HERR_NOMEM;
    init_cfg(x, &c, dev);
    if (!rc)
        rc = stack_cfg_split(&c, "decoder", ly->tp, t, ly->ep, d, err);
    if (!rc)
        rc = stack_init(&st, &c, L, err);
    if (!rc) {
        attach(&st, x->p[r], x->g[r], x);
        st.tp_comm = tpc;
        st.ep_comm = epc;
        st.sp = ly->sp;
        int N = ly->bad_n && t == 1 ? ly->bad_n : ly->N;
        int Nl = ly->sp ? N / ly->tp : N;
        rc = run_stack(x, &st, d, N, ly->sp ? t * Nl : 0, Nl, x->out[r], x->dx[r],
                       &x->aux[r], err);
    }
    stack_free(&st);
    kdev_free(dev);
    comm_free(epc);
    comm_free(tpc);
    return rc;
}

static void check_rel(const float *got, const float *ref, size_t n, const tu_rng *rng,
                      const char *lname, const char *what, int l, int r)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s (layer %d, rank %d)", lname, what, l, r);
    TU_ASSERT_LE(tu_rel_l2_ff(got, ref, n), TOL, rng, msg);
}

static void run_layout(const layout *ly)
{
    tu_rng rng = tu_rng_fresh();
    tctx *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->ly = *ly;
    x->rng = &rng;
    stack_shape *s = &x->shape;
    s->layers = L;
    s->hidden = ly->H;
    s->ffn = ly->F;
    s->heads = ly->heads;
    s->kv_heads = ly->kv;
    s->head_dim = ly->D;
    s->norm = ly->norm;
    s->norm_eps = 1e-5f;
    s->mlp = ly->mlp;
    s->gelu = GELU_TANH;
    s->bias_qkv = s->bias_proj = s->bias_mlp = ly->bias;
    s->qk_norm = ly->qk_norm;
    s->pos = POS_ROPE;
    s->rope_theta = 10000.0;
    build_descs(x);
    int H = ly->H, N = ly->N, nr = ly->tp * ly->ep;
    assert_true(nr <= MAXR);

    /* parameters */
    for (int l = 0; l < L; l++)
        for (int i = 0; i < x->nt[l]; i++) {
            const tdesc *d = &x->td[l][i];
            size_t n = (size_t)d->rows * d->cols;
            x->full[l][i] = tu_falloc(n);
            x->gref[l][i] = tu_falloc(n);
            if (d->init == 0) {
                float a = 1.0f / sqrtf((float)(d->cut == CUT_EXPERT ? H : d->cols));
                tu_fill_uniform(&rng, x->full[l][i], n, -a, a);
            } else if (d->init == 1) {
                tu_fill_uniform(&rng, x->full[l][i], n, 0.8f, 1.2f);
            } else {
                tu_fill_uniform(&rng, x->full[l][i], n, -0.2f, 0.2f);
            }
        }
    /* micro batches: random sequences, positions restarting in each */
    for (int d = 0; d < ly->ep; d++) {
        x->x[d] = tu_falloc((size_t)N * H);
        x->dy[d] = tu_falloc((size_t)N * H);
        tu_fill_normal(&rng, x->x[d], (size_t)N * H, 0, 1);
        tu_fill_normal(&rng, x->dy[d], (size_t)N * H, 0, 1);
        int n = 0, *cu = x->cu[d];
        cu[0] = 0;
        while (cu[n] < N) {
            int len = tu_randint(&rng, 1, N + 1);
            cu[n + 1] = cu[n] + len < N ? cu[n] + len : N;
            n++;
        }
        x->nseq[d] = n;
        int *pos = tu_ialloc((size_t)N);
        for (int q = 0; q < n; q++)
            for (int k = cu[q]; k < cu[q + 1]; k++)
                pos[k] = k - cu[q];
        x->cos[d] = tu_falloc((size_t)N * ly->D / 2);
        x->sin[d] = tu_falloc((size_t)N * ly->D / 2);
        kcpu_rope_table_1d(x->cos[d], x->sin[d], pos, N, ly->D, 10000.0f);
        free(pos);
        x->out_ref[d] = tu_falloc((size_t)N * H);
        x->dx_ref[d] = tu_falloc((size_t)N * H);
    }

    /* reference: the whole stack, micro batch after micro batch */
    {
        hearth_err err;
        stack_cfg c;
        stack st;
        kdev *dev;
        assert_int_equal(kdev_create(&dev, KDEV_CPU, NULL, 0), 0);
        init_cfg(x, &c, dev);
        assert_int_equal(stack_init(&st, &c, L, &err), 0);
        attach(&st, x->full, x->gref, x);
        for (int d = 0; d < ly->ep; d++) {
            int rc = run_stack(x, &st, d, N, 0, N, x->out_ref[d], x->dx_ref[d], &x->aux_ref[d],
                               &err);
            if (rc)
                fail_msg("%s: reference failed: %s", ly->name, err.msg);
        }
        stack_free(&st);
        kdev_free(dev);
    }

    /* the ranks' slices */
    for (int r = 0; r < nr; r++) {
        int t = r % ly->tp, d = r / ly->tp;
        for (int l = 0; l < L; l++)
            for (int i = 0; i < x->nt[l]; i++) {
                slice sl = cut_of(ly, &x->td[l][i], t, d);
                x->p[r][l][i] = tu_falloc(slice_numel(&sl));
                x->g[r][l][i] = tu_falloc(slice_numel(&sl));
                slice_copy(x->full[l][i], x->p[r][l][i], &x->td[l][i], &sl, 0);
            }
        x->out[r] = tu_falloc((size_t)N * H);
        x->dx[r] = tu_falloc((size_t)N * H);
    }
    hearth_err err;
    if (ranks_run(nr, 60000, rank_main, x, x->rc, x->err, &err))
        fail_msg("%s: %s", ly->name, err.msg);
    for (int r = 0; r < nr; r++) {
        if (ly->bad_n && x->rc[r] != HERR_RUNTIME)
            fail_msg("%s: rank %d returned %d, expected a failed collective", ly->name, r,
                     x->rc[r]);
        if (!ly->bad_n && x->rc[r])
            fail_msg("%s: rank %d failed (%d): %s", ly->name, r, x->rc[r], x->err[r].msg);
    }
    if (ly->bad_n)
        goto done;

    /* outputs, input gradients, aux */
    int Nl = ly->sp ? N / ly->tp : N;
    for (int r = 0; r < nr; r++) {
        int t = r % ly->tp, d = r / ly->tp, row0 = ly->sp ? t * Nl : 0;
        check_rel(x->out[r], x->out_ref[d] + (size_t)row0 * H, (size_t)Nl * H, &rng, ly->name,
                  "output", -1, r);
        check_rel(x->dx[r], x->dx_ref[d] + (size_t)row0 * H, (size_t)Nl * H, &rng, ly->name,
                  "input gradient", -1, r);
        double ad = fabs(x->aux[r] - x->aux_ref[d]);
        TU_ASSERT_LE(ad, TOL * (1 + fabs(x->aux_ref[d])), &rng, "aux loss");
        if (ly->E > 0)
            assert_true(x->aux_ref[d] > 0);
    }
    /* parameter gradients, re-assembled */
    for (int l = 0; l < L; l++)
        for (int i = 0; i < x->nt[l]; i++) {
            const tdesc *td = &x->td[l][i];
            size_t n = (size_t)td->rows * td->cols;
            int sum = td->red == RED_SUM || (td->red == RED_SP && ly->sp);
            float *acc = tu_falloc(n);
            for (int t = 0; t < ly->tp; t++) {
                if (!sum || t == 0)
                    memset(acc, 0, n * sizeof *acc);
                for (int tt = sum ? 0 : t; tt < (sum ? ly->tp : t + 1); tt++)
                    for (int d = 0; d < ly->ep; d++) {
                        slice sl = cut_of(ly, td, tt, d);
                        slice_copy(acc, x->g[d * ly->tp + tt][l][i], td, &sl, 1);
                    }
                check_rel(acc, x->gref[l][i], n, &rng, ly->name, td->name, l, sum ? -1 : t);
                if (sum)
                    break;
            }
            free(acc);
        }

done:
    for (int r = 0; r < nr; r++) {
        for (int l = 0; l < L; l++)
            for (int i = 0; i < x->nt[l]; i++) {
                free(x->p[r][l][i]);
                free(x->g[r][l][i]);
            }
        free(x->out[r]);
        free(x->dx[r]);
    }
    for (int d = 0; d < ly->ep; d++) {
        free(x->x[d]);
        free(x->dy[d]);
        free(x->cos[d]);
        free(x->sin[d]);
        free(x->out_ref[d]);
        free(x->dx_ref[d]);
    }
    for (int l = 0; l < L; l++)
        for (int i = 0; i < x->nt[l]; i++) {
            free(x->full[l][i]);
            free(x->gref[l][i]);
        }
    free(x);
}

/* ---- layouts ------------------------------------------------------------------------ */

static layout base(const char *name, int tp, int ep, int sp)
{
    return (layout){ .name = name, .norm = NORM_RMSNORM, .mlp = MLP_SWIGLU, .H = 16,
                     .heads = 4, .kv = 2, .D = 8, .F = 24, .N = 16, .tp = tp, .ep = ep,
                     .sp = sp };
}

static layout gpt(const char *name, int tp, int sp)
{
    layout ly = base(name, tp, 1, sp);
    ly.norm = NORM_LAYERNORM;
    ly.mlp = MLP_GELU;
    ly.bias = 1;
    ly.kv = 4;
    return ly;
}

static layout moe(const char *name, int tp, int ep, int sp)
{
    layout ly = base(name, tp, ep, sp);
    ly.E = 4;
    ly.K = 2;
    ly.Fm = 8;
    ly.Fs = 12;
    ly.qk_norm = 1;
    return ly;
}

static void test_tp2_swiglu_qknorm(void **state)
{
    (void)state;
    layout ly = base("tp2 swiglu qk_norm", 2, 1, 0);
    ly.qk_norm = 1;
    run_layout(&ly);
    ly.name = "tp2 swiglu qk_norm sp";
    ly.sp = 1;
    run_layout(&ly);
}

static void test_tp4_layernorm_gelu_bias(void **state)
{
    (void)state;
    layout ly = gpt("tp4 layernorm gelu bias", 4, 0);
    run_layout(&ly);
    ly = gpt("tp4 layernorm gelu bias sp", 4, 1);
    run_layout(&ly);
    ly = gpt("tp2 layernorm gelu bias sp", 2, 1);
    run_layout(&ly);
}

static void test_tp4_gqa_kv_replicated(void **state)
{
    (void)state;
    layout ly = base("tp4 heads 4 kv 2 qk_norm bias sp", 4, 1, 1);
    ly.qk_norm = 1;
    ly.bias = 1;
    run_layout(&ly);
    ly = base("tp4 heads 4 kv 1", 4, 1, 0);
    ly.kv = 1;
    run_layout(&ly);
    ly = base("tp2 heads 4 kv 1 sp", 2, 1, 1);
    ly.kv = 1;
    run_layout(&ly);
}

static void test_moe_tp2(void **state)
{
    (void)state;
    layout ly = moe("moe shared tp2", 2, 1, 0);
    run_layout(&ly);
    ly = moe("moe shared tp2 sp", 2, 1, 1);
    ly.bias = 1;
    run_layout(&ly);
}

static void test_moe_ep2(void **state)
{
    (void)state;
    layout ly = moe("moe ep2", 1, 2, 0);
    run_layout(&ly);
    ly = moe("moe no shared ep2 E8 K3", 1, 2, 0);
    ly.E = 8;
    ly.K = 3;
    ly.Fs = 0;
    run_layout(&ly);
}

static void test_moe_tp2_ep2(void **state)
{
    (void)state;
    layout ly = moe("moe tp2 x ep2 sp", 2, 2, 1);
    run_layout(&ly);
    ly = moe("moe tp2 x ep2", 2, 2, 0);
    ly.kv = 1;
    run_layout(&ly);
}

/* A collective that fails (here: ranks disagreeing on the token count) makes every rank's
 * forward return the error instead of hanging or computing on garbage. */
static void test_collective_failure_propagates(void **state)
{
    (void)state;
    layout ly = base("mismatched tokens sp", 2, 1, 1);
    ly.bad_n = 8;
    run_layout(&ly);
    ly = moe("mismatched tokens moe", 2, 1, 0);
    ly.bad_n = 8;
    run_layout(&ly);
}

/* Sequence parallel needs the micro batch to split over tp. */
static void test_sp_uneven_tokens(void **state)
{
    (void)state;
    tctx *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->ly = base("uneven", 2, 1, 1);
    x->shape = (stack_shape){ .layers = L, .hidden = 16, .ffn = 24, .heads = 4, .kv_heads = 2,
                              .head_dim = 8, .norm_eps = 1e-5f, .pos = POS_ROPE };
    comm_world *w;
    comm *h;
    hearth_err err;
    assert_int_equal(comm_local_world_create(&w, 1, NULL, &err), 0);
    assert_int_equal(comm_local_world_rank(w, 0, &h, &err), 0);
    stack_cfg c;
    stack st;
    kdev *dev;
    assert_int_equal(kdev_create(&dev, KDEV_CPU, NULL, 0), 0);
    init_cfg(x, &c, dev);
    assert_int_equal(stack_cfg_split(&c, "decoder", 2, 1, 1, 0, &err), 0);
    assert_int_equal(stack_init(&st, &c, L, &err), 0);
    st.tp_comm = h;   /* never reached: the reservation fails first */
    st.sp = 1;
    assert_int_equal(stack_reserve(&st, 15, &err), HERR_RUNTIME);
    assert_non_null(strstr(err.msg, "15"));
    assert_int_equal(stack_reserve(&st, 16, &err), 0);
    stack_free(&st);
    kdev_free(dev);
    comm_free(h);
    comm_local_world_free(w);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_swiglu_qknorm),
        cmocka_unit_test(test_tp4_layernorm_gelu_bias),
        cmocka_unit_test(test_tp4_gqa_kv_replicated),
        cmocka_unit_test(test_moe_tp2),
        cmocka_unit_test(test_moe_ep2),
        cmocka_unit_test(test_moe_tp2_ep2),
        cmocka_unit_test(test_collective_failure_propagates),
        cmocka_unit_test(test_sp_uneven_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
