/* fp8_model.c - the FP8 plan of a model and its FP8 linears (fp8.h): the scales here,
 * the products in the device (kdev_fp8_matmul_*: FP8 GEMMs on a GPU, the emulation on
 * the cpu). */
#include <stdlib.h>
#include <string.h>

#include "model/fp8.h"
#include "model/internal.h"

/* ---- state -------------------------------------------------------------------------- */

enum { T_X = 0, T_W = 1, T_DY = 2 };

/* Shared by a model and its clones: the plan and every linear's amax histories. */
typedef struct {
    fp8_plan plan;
    float *hist;              /* [units][3][history] */
    int *pos;                 /* [units][3] */
    size_t units;
    /* The amaxes not yet in the histories (delayed scaling: a call's scale comes from
     * the history, its own amax is needed only by the next call of its slot, so it stays
     * on the device until then, and one download brings every pending one). */
    float *amax_dev;          /* [units][3] on amax_on; NULL until the first */
    float *amax_host;         /* [units][3] */
    unsigned char *pending;   /* [units][3] */
    size_t n_pending;
    kdev *amax_on;
} fp8_shared;

struct fp8_layer {
    struct fp8_model *fm;
    int comp, layer, n_layers, tp;
    comm *tp_comm;            /* reduce the amax of split linears here; NULL: none */
    int El;                   /* local experts (units: FP8_KINDS + 2 El) */
    size_t unit0;             /* first unit in the shared arrays */
    float *saved;             /* this object's: [units][2] scales (x, w) of the last forward
                                 (0: no forward yet) */
    int tokens;               /* this object's last forward token count */
    int replay;               /* forwards rebuild activations (fp8_layer_set_replay) */
};

typedef struct fp8_model {
    fp8_shared *sh;           /* owned when owner */
    int owner;
    fp8_layer *layers;
    int n_layers;
    float *scratch;           /* this object's emulation scratch (on its model's device;
                                 only where the device has no FP8 GEMM for a shape) */
    kdev *dev;
    size_t cap;
} fp8_model;

static int amax_flush(fp8_shared *sh, hearth_err *err);

static int n_units(const fp8_layer *f) { return FP8_KINDS + 2 * f->El; }

static int unit_of(const fp8_layer *f, int kind, int e)
{
    if (kind == FP8_EXPERT_FC1)
        return FP8_KINDS + e;
    if (kind == FP8_EXPERT_FC2)
        return FP8_KINDS + f->El + e;
    return kind;
}

/* The linears split over tp (model_par.h): their amax differs between tp ranks. */
static int split_kind(int kind)
{
    return kind == FP8_QKV || kind == FP8_PROJ || kind == FP8_FC1 || kind == FP8_FC2 ||
           kind == FP8_LM_HEAD;
}

static void fm_free(fp8_model *fm)
{
    for (int i = 0; i < fm->n_layers; i++)
        free(fm->layers[i].saved);
    free(fm->layers);
    kdev_release(fm->dev, fm->scratch);
    if (fm->owner && fm->sh) {
        kdev_release(fm->sh->amax_on, fm->sh->amax_dev);
        free(fm->sh->amax_host);
        free(fm->sh->pending);
        fp8_plan_clear(&fm->sh->plan);
        free(fm->sh->hist);
        free(fm->sh->pos);
        free(fm->sh);
    }
    free(fm);
}

void fp8_model_free(model *m)
{
    if (!m->fp8)
        return;
    fm_free(m->fp8);
    m->fp8 = NULL;
}

/* Every place of m that holds an fp8_layer pointer, in a fixed order, with what the
 * layer needs to know; n counts them (layers == NULL: count only). */
static int layout(model *m, fp8_layer *layers, fp8_layer ***slots)
{
    int n = 0;
    if (m->enc.present)
        for (int l = 0; l < m->enc.st.L; l++, n++)
            if (layers) {
                layers[n] = (fp8_layer){ .comp = FP8_COMP_ENCODER, .layer = l,
                                         .n_layers = m->shape.encoder.s.layers,
                                         .tp = m->enc.st.c.tp, .tp_comm = m->enc.st.tp_comm };
                slots[n] = &m->enc.st.layers[l].p.fp8;
            }
    if (m->proj.present) {
        if (layers) {
            layers[n] = (fp8_layer){ .comp = FP8_COMP_PROJECTOR, .layer = FP8_ANY,
                                     .n_layers = 1, .tp = 1 };
            slots[n] = &m->proj.fp8;
        }
        n++;
    }
    if (m->dec.present) {
        for (int l = 0; l < m->dec.st.L; l++, n++)
            if (layers) {
                stack *st = &m->dec.st;
                layers[n] = (fp8_layer){ .comp = FP8_COMP_DECODER,
                                         .layer = m->par.first_layer + l,
                                         .n_layers = m->shape.decoder.s.layers,
                                         .tp = st->c.tp, .tp_comm = st->tp_comm,
                                         .El = st->layers[l].moe ? st->c.El : 0 };
                slots[n] = &st->layers[l].p.fp8;
            }
        if (m->dec.has_head) {
            if (layers) {
                layers[n] = (fp8_layer){ .comp = FP8_COMP_DECODER, .layer = FP8_ANY,
                                         .n_layers = m->shape.decoder.s.layers,
                                         .tp = m->dec.tp, .tp_comm = m->dec.tp_comm };
                slots[n] = &m->dec.head_fp8;
            }
            n++;
        }
    }
    return n;
}

int model_fp8_state(model *m, float **hist, size_t *n_hist, int **pos, size_t *n_pos,
                    hearth_err *err)
{
    fp8_model *fm = m->fp8;
    *hist = NULL;
    *pos = NULL;
    *n_hist = *n_pos = 0;
    if (!fm)
        return 0;
    if (!fm->owner)
        return herr_set(err, HERR_RUNTIME, "fp8: the amax histories belong to the model "
                        "this one was cloned from");
    int rc = amax_flush(fm->sh, err);
    if (rc)
        return rc;
    *hist = fm->sh->hist;
    *pos = fm->sh->pos;
    *n_hist = fm->sh->units * 3 * (size_t)fm->sh->plan.history;
    *n_pos = fm->sh->units * 3;
    return 0;
}

/* Builds m's fp8_model over `sh` (owned when owner) and points m's parts at it. */
static int attach(model *m, fp8_shared *sh, int owner, hearth_err *err)
{
    fp8_model *fm = calloc(1, sizeof *fm);
    int n = layout(m, NULL, NULL);
    fp8_layer ***slots = calloc((size_t)n + 1, sizeof *slots);
    if (fm)
        fm->layers = calloc((size_t)n + 1, sizeof *fm->layers);
    if (!fm || !slots || !fm->layers) {
        free(slots);
        if (fm)
            free(fm->layers);
        free(fm);
        return herr_set(err, HERR_NOMEM, "fp8: out of memory");
    }
    fm->sh = sh;
    fm->owner = owner;
    fm->n_layers = n;
    m->fp8 = fm;
    layout(m, fm->layers, slots);
    size_t u = 0;
    for (int i = 0; i < n; i++) {
        fp8_layer *f = &fm->layers[i];
        f->fm = fm;
        f->unit0 = u;
        u += (size_t)n_units(f);
        f->saved = calloc((size_t)n_units(f) * 2, sizeof(float));
        if (!f->saved) {
            free(slots);
            return herr_set(err, HERR_NOMEM, "fp8: out of memory");
        }
    }
    if (owner) {
        sh->units = u;
        size_t H = (size_t)sh->plan.history;
        sh->hist = calloc(u * 3 * H + 1, sizeof(float));
        sh->pos = calloc(u * 3 + 1, sizeof(int));
        if (!sh->hist || !sh->pos) {
            free(slots);
            return herr_set(err, HERR_NOMEM, "fp8: out of memory for amax histories");
        }
    }
    for (int i = 0; i < n; i++)
        *slots[i] = &fm->layers[i];
    free(slots);
    return 0;
}

static void detach(model *m)
{
    if (!m->fp8)
        return;
    fp8_layer ***slots = calloc((size_t)m->fp8->n_layers + 1, sizeof *slots);
    fp8_layer *tmp = calloc((size_t)m->fp8->n_layers + 1, sizeof *tmp);
    if (slots && tmp) {
        layout(m, tmp, slots);
        for (int i = 0; i < m->fp8->n_layers; i++)
            *slots[i] = NULL;
    }
    free(slots);
    free(tmp);
    fp8_model_free(m);
}

static int plan_copy(fp8_plan *dst, const fp8_plan *src, hearth_err *err)
{
    *dst = *src;
    dst->rules = NULL;
    dst->keep = NULL;
    if (dst->history < 1)
        dst->history = FP8_DEFAULT_HISTORY;
    dst->rules = malloc(((size_t)src->n_rules + 1) * sizeof *dst->rules);
    dst->keep = malloc(((size_t)src->n_keep + 1) * sizeof *dst->keep);
    if (!dst->rules || !dst->keep) {
        fp8_plan_clear(dst);
        return herr_set(err, HERR_NOMEM, "fp8: out of memory");
    }
    if (src->n_rules)
        memcpy(dst->rules, src->rules, (size_t)src->n_rules * sizeof *dst->rules);
    if (src->n_keep)
        memcpy(dst->keep, src->keep, (size_t)src->n_keep * sizeof *dst->keep);
    return 0;
}

int model_set_fp8(model *m, const fp8_plan *plan, hearth_err *err)
{
    if (m->owner)
        return herr_set(err, HERR_CONFIG, "fp8: set the plan on the model, not on a clone");
    detach(m);
    if (!plan || (!plan->all && plan->n_rules == 0))
        return 0;                       /* nothing in FP8: the plain fp32 path */
    fp8_shared *sh = calloc(1, sizeof *sh);
    if (!sh)
        return herr_set(err, HERR_NOMEM, "fp8: out of memory");
    int rc = plan_copy(&sh->plan, plan, err);
    if (rc) {
        free(sh);
        return rc;
    }
    if ((rc = attach(m, sh, 1, err))) {
        if (!m->fp8) {
            fp8_plan_clear(&sh->plan);
            free(sh);
        }
        detach(m);
    }
    return rc;
}

int fp8_model_clone(model *clone, const model *owner, hearth_err *err)
{
    if (!owner->fp8)
        return 0;
    int rc = attach(clone, owner->fp8->sh, 0, err);
    if (rc)
        detach(clone);
    return rc;
}

/* ---- a linear outside a model ----------------------------------------------------------
 * The layer benchmark's: one layer whose plan is a single rule for its kind, so that the
 * calls below always take the FP8 path, with the model's code. */

int fp8_layer_create(fp8_layer **out, int comp, int kind, int tp, hearth_err *err)
{
    *out = NULL;
    fp8_rule rule = { .comp = comp, .kind = kind, .tp = tp };
    fp8_plan plan = { .rules = &rule, .n_rules = 1, .history = 1, .current = 0 };
    fp8_model *fm = calloc(1, sizeof *fm);
    fp8_shared *sh = calloc(1, sizeof *sh);
    fp8_layer *f = calloc(1, sizeof *f);
    int rc = fm && sh && f ? plan_copy(&sh->plan, &plan, err)
                           : herr_set(err, HERR_NOMEM, "fp8: out of memory");
    if (rc) {
        free(fm);
        free(sh);
        free(f);
        return rc;
    }
    *fm = (fp8_model){ .sh = sh, .owner = 1, .layers = f, .n_layers = 1 };
    *f = (fp8_layer){ .fm = fm, .comp = comp, .layer = FP8_ANY, .n_layers = 1, .tp = tp,
                      .El = kind == FP8_EXPERT_FC1 || kind == FP8_EXPERT_FC2 };
    sh->units = (size_t)n_units(f);
    f->saved = calloc(sh->units * 2, sizeof(float));
    sh->hist = calloc(sh->units * 3, sizeof(float));
    sh->pos = calloc(sh->units * 3, sizeof(int));
    if (!f->saved || !sh->hist || !sh->pos) {
        fm_free(fm);
        return herr_set(err, HERR_NOMEM, "fp8: out of memory");
    }
    *out = f;
    return 0;
}

void fp8_layer_free(fp8_layer *f)
{
    if (f)
        fm_free(f->fm);
}

/* ---- the linears ----------------------------------------------------------------------- */

static int uses(fp8_layer *f, int kind, int tokens)
{
    if (!f)
        return 0;
    if (tokens > 0)
        f->tokens = tokens;
    return fp8_plan_uses(&f->fm->sh->plan, f->comp, kind, f->layer, f->n_layers, f->tp,
                         f->tokens);
}

int fp8_linear_uses(fp8_layer *f, int kind, int tokens)
{
    return uses(f, kind, tokens);
}

static float *scratch(kdev *dev, fp8_layer *f, size_t n, hearth_err *err)
{
    fp8_model *fm = f->fm;
    if (n > fm->cap) {
        kdev_release(dev, fm->scratch);
        fm->scratch = NULL;
        fm->cap = 0;
        fm->dev = dev;
        if (dev_alloc(dev, (void **)&fm->scratch, n * sizeof(float), "fp8 quantised values",
                      err))
            return NULL;
        fm->cap = n;
    }
    return fm->scratch;
}

/* amax[0..n) reduced (max) over the tp group when the linear is split there. */
static int reduce_amax(fp8_layer *f, int kind, float *amax, int n, hearth_err *err)
{
    if (!f->tp_comm || f->tp <= 1 || !split_kind(kind))
        return 0;
    int rc = comm_allreduce(f->tp_comm, amax, amax, (size_t)n, COMM_F32, COMM_MAX, err);
    return rc ? herr_prefix(err, rc, "fp8: %s %s amax", fp8_comp_name(f->comp),
                            fp8_kind_name(kind))
              : 0;
}

/* The amaxes pending on the device into their histories, with one download. */
static int amax_flush(fp8_shared *sh, hearth_err *err)
{
    if (!sh->n_pending)
        return 0;
    size_t n = sh->units * 3, H = (size_t)sh->plan.history;
    kdev_download(sh->amax_on, sh->amax_host, sh->amax_dev, n * sizeof(float));
    int rc = dev_check(sh->amax_on, err);
    if (rc)
        return herr_prefix(err, rc, "fp8: reading the amaxes");
    for (size_t k = 0; k < n; k++)
        if (sh->pending[k]) {
            kcpu_fp8_history_push(sh->hist + k * H, (int)H, &sh->pos[k], sh->amax_host[k]);
            sh->pending[k] = 0;
        }
    sh->n_pending = 0;
    return 0;
}

/* Whether an amax may wait on the device: delayed scaling with a history to scale from,
 * one device for every pending one, no tp reduction (that needs the value). */
static int amax_can_wait(const fp8_layer *f, int kind, float hist_amax, kdev *dev)
{
    const fp8_shared *sh = f->fm->sh;
    return hist_amax > 0.0f && !(f->tp_comm && f->tp > 1 && split_kind(kind)) &&
           (!sh->amax_on || sh->amax_on == dev);
}

static int amax_wait_alloc(fp8_shared *sh, kdev *dev, hearth_err *err)
{
    if (sh->amax_dev)
        return 0;
    size_t n = sh->units * 3;
    if (!sh->amax_host)
        sh->amax_host = calloc(n + 1, sizeof(float));
    if (!sh->pending)
        sh->pending = calloc(n + 1, 1);
    if (!sh->amax_host || !sh->pending)
        return herr_set(err, HERR_NOMEM, "fp8: out of memory for the pending amaxes");
    int rc = dev_alloc(dev, (void **)&sh->amax_dev, (n + 1) * sizeof(float), "fp8 amaxes",
                       err);
    if (!rc)
        sh->amax_on = dev;
    return rc;
}

/* *scale: the scale of tensor t (x[n]) of unit u for this call, x's amax recorded in the
 * history (delayed scaling) or used itself (current scaling, the LM head, an empty
 * history).  *record: where the amax is pending, the device float that the FP8 GEMM of
 * this call must set (kdev_fp8_amax, in stream order, no wait); else NULL, the amax
 * already taken. */
static int tensor_scale(kdev *dev, fp8_layer *f, int kind, int u, int t, const float *x,
                        size_t n, kfp8_format fmt, float *scale, float **record,
                        hearth_err *err)
{
    fp8_shared *sh = f->fm->sh;
    const fp8_plan *p = &sh->plan;
    int rc, delayed = !p->current && kind != FP8_LM_HEAD;
    size_t H = (size_t)p->history, k = (f->unit0 + (size_t)u) * 3 + (size_t)t;
    float *h = sh->hist + k * H, hm = 0.0f, amax;
    *record = NULL;
    if (delayed) {
        if (sh->pending && sh->pending[k] && (rc = amax_flush(sh, err)))
            return rc;
        hm = kcpu_fp8_history_amax(h, (int)H);
        if (amax_can_wait(f, kind, hm, dev)) {
            if ((rc = amax_wait_alloc(sh, dev, err)))
                return rc;
            *record = sh->amax_dev + k;
            sh->pending[k] = 1;
            sh->n_pending++;
            *scale = kcpu_fp8_scale(hm, fmt, p->margin, 1.0f);
            return 0;
        }
    }
    kdev_amax(dev, &amax, x, n);
    if ((rc = dev_check(dev, err)) || (rc = reduce_amax(f, kind, &amax, 1, err)))
        return rc;
    if (!delayed) {
        *scale = kcpu_fp8_scale(amax, fmt, p->margin, 1.0f);
        return 0;
    }
    *scale = kcpu_fp8_scale(hm > 0.0f ? hm : amax, fmt, p->margin, 1.0f);
    kcpu_fp8_history_push(h, (int)H, &sh->pos[k], amax);
    return 0;
}

void fp8_layer_set_replay(fp8_layer *f, int on)
{
    if (f)
        f->replay = on != 0;
}

/* The scales of a replayed forward: those the last forward of unit u saved.  The LM head
 * is never replayed (its current scaling recomputes its chunks in its own backward). */
static int replay_scales(const fp8_layer *f, int kind, int u, float *sx, float *sw,
                         hearth_err *err)
{
    *sx = f->saved[2 * u];
    *sw = f->saved[2 * u + 1];
    if (kind == FP8_LM_HEAD || !(*sx > 0.0f) || !(*sw > 0.0f))
        return herr_set(err, HERR_RUNTIME, "fp8: %s %s (layer %d) replayed without a "
                        "forward to replay", fp8_comp_name(f->comp), fp8_kind_name(kind),
                        f->layer);
    return 0;
}

int fp8_linear_forward(kdev *dev, fp8_layer *f, int kind, int e, int tokens, float *out,
                       const float *inp, const float *w, const float *bias, int M, int K,
                       int N, hearth_err *err)
{
    if (!uses(f, kind, tokens)) {
        kdev_matmul_forward(dev, out, inp, w, bias, M, K, N);
        return 0;
    }
    size_t nx = (size_t)M * K, nw = (size_t)N * K;
    int u = unit_of(f, kind, e), rc;
    float sx, sw;
    kdev_fp8_amax rec = { NULL, NULL, NULL };   /* the amaxes this call's GEMM records */
    if (f->replay) {
        /* The forward's own scales: the same quantised operands, so the same output bit
         * for bit, and no amax recorded twice.  No tp reduction either: every rank of the
         * group replays the same layer at the same point. */
        if ((rc = replay_scales(f, kind, u, &sx, &sw, err)))
            return rc;
    } else {
        if ((rc = tensor_scale(dev, f, kind, u, T_X, inp, nx, KFP8_E4M3, &sx, &rec.x, err)) ||
            (rc = tensor_scale(dev, f, kind, u, T_W, w, nw, KFP8_E4M3, &sw, &rec.w, err)))
            return rc;
        f->saved[2 * u] = sx;
        f->saved[2 * u + 1] = sw;
    }
    /* The device's FP8 GEMM; where it has none for the shape (the cpu: never), the
     * emulation in the fp32 scratch, which is allocated only then.  Other failures show
     * in the device's status, as for every op. */
    if (kdev_fp8_matmul_forward(dev, NULL, out, inp, w, bias, M, K, N, sx, sw, &rec) ==
        HERR_NOALGO) {
        float *ws = scratch(dev, f, nx + nw, err);
        if (!ws)
            return HERR_NOMEM;
        kdev_fp8_matmul_forward(dev, ws, out, inp, w, bias, M, K, N, sx, sw, &rec);
    }
    return 0;
}

static int linear_backward(kdev *dev, fp8_layer *f, int kind, int e, float *dinp, float *dw,
                           float *db, const float *dout, const float *inp, const float *w,
                           int M, int K, int N, int set, hearth_err *err)
{
    if (!uses(f, kind, 0)) {
        if (set)
            kdev_matmul_backward_set(dev, dinp, dw, db, dout, inp, w, M, K, N);
        else
            kdev_matmul_backward(dev, dinp, dw, db, dout, inp, w, M, K, N);
        return 0;
    }
    if (set && dinp)   /* the FP8 products accumulate */
        kdev_zero(dev, dinp, (size_t)M * K * sizeof(float));
    size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    int u = unit_of(f, kind, e), rc;
    float sx = f->saved[2 * u], sw = f->saved[2 * u + 1], sd;
    kdev_fp8_amax rec = { NULL, NULL, NULL };   /* dy's amax, where this call records it */
    float *none;   /* the LM head's current scaling records nothing */
    /* the LM head's current scaling: recompute exactly what this chunk's forward used */
    if (kind == FP8_LM_HEAD &&
        ((rc = tensor_scale(dev, f, kind, u, T_X, inp, nx, KFP8_E4M3, &sx, &none, err)) ||
         (rc = tensor_scale(dev, f, kind, u, T_W, w, nw, KFP8_E4M3, &sw, &none, err))))
        return rc;
    if ((rc = tensor_scale(dev, f, kind, u, T_DY, dout, ny, KFP8_E5M2, &sd, &rec.dy, err)))
        return rc;
    if (kdev_fp8_matmul_backward(dev, NULL, dinp, dw, dout, inp, w, M, K, N, sx, sw, sd,
                                 KFP8_E5M2, &rec) == HERR_NOALGO) {   /* as in the forward */
        float *ws = scratch(dev, f, ny + (dw ? nx : 0) + (dinp ? nw : 0), err);
        if (!ws)
            return HERR_NOMEM;
        kdev_fp8_matmul_backward(dev, ws, dinp, dw, dout, inp, w, M, K, N, sx, sw, sd,
                                 KFP8_E5M2, &rec);
    }
    if (db)         /* the bias gradient from the unquantised dy, as the fused GPU cast */
        kdev_matmul_backward(dev, NULL, NULL, db, dout, NULL, NULL, M, K, N);
    return 0;
}

int fp8_linear_backward(kdev *dev, fp8_layer *f, int kind, int e, float *dinp, float *dw,
                        float *db, const float *dout, const float *inp, const float *w,
                        int M, int K, int N, hearth_err *err)
{
    return linear_backward(dev, f, kind, e, dinp, dw, db, dout, inp, w, M, K, N, 0, err);
}

int fp8_linear_backward_set(kdev *dev, fp8_layer *f, int kind, int e, float *dinp,
                            float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int M, int K, int N, hearth_err *err)
{
    return linear_backward(dev, f, kind, e, dinp, dw, db, dout, inp, w, M, K, N, 1, err);
}
