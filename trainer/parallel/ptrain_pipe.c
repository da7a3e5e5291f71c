/* ptrain_pipe.c - the decoder pipeline of one rank: its op list (pp_schedule), one
 * activation slot per micro batch in flight, and the activations and their gradients
 * sent between neighbouring virtual stages.
 *
 * Virtual stage vs = chunk * pp + stage; its input comes from vs - 1 and its output goes
 * to vs + 1, on the PP group's ranks (vs % pp).  A message to virtual stage r about micro
 * batch j has tag 2 * (j * n_virtual + r) (+1 for gradients), so every (peer, tag) pair
 * is used once per step and the order of sends never matters (sends are buffered). */
#include "parallel/ptrain_internal.h"

#include <stdlib.h>
#include <string.h>

int pt_pipe_init(ptrain *t, hearth_err *err)
{
    int cap = 2 * t->M_local * t->vpp;
    t->ops = calloc((size_t)(cap > 0 ? cap : 1), sizeof *t->ops);
    t->slots = calloc((size_t)t->vpp, sizeof *t->slots);
    t->n_slots = calloc((size_t)t->vpp, sizeof *t->n_slots);
    if (!t->ops || !t->slots || !t->n_slots)
        return herr_set(err, HERR_NOMEM, "pipeline: out of memory");
    /* The same op lists on every stage, checked for deadlocks before anything runs. */
    int rc = pp_schedule_check(t->lay.pp, t->vpp, t->M_local, NULL, err);
    if (rc)
        return rc;
    int n = pp_schedule_build(t->ops, cap, t->lay.pp, t->vpp, t->dec->coords.p, t->M_local,
                              err);
    if (n < 0)
        return n;
    t->n_ops = n;
    return 0;
}

void pt_pipe_free(ptrain *t)
{
    if (t->slots)
        for (int v = 0; v < t->vpp; v++) {
            for (int i = 0; i < t->n_slots[v]; i++) {
                if (i > 0)
                    model_free(t->slots[v][i].m);
                free(t->slots[v][i].xin);
            }
            free(t->slots[v]);
        }
    free(t->slots);
    free(t->n_slots);
    free(t->ops);
    free(t->xbuf);
}

/* A free slot of chunk v for micro batch j; slot 0 is the chunk's own model, more are
 * clones made on demand (as many as the schedule keeps in flight). */
static int slot_acquire(ptrain *t, int v, int j, pt_slot **out, hearth_err *err)
{
    for (int i = 0; i < t->n_slots[v]; i++)
        if (t->slots[v][i].micro < 0) {
            t->slots[v][i].micro = j;
            *out = &t->slots[v][i];
            return 0;
        }
    int n = t->n_slots[v];
    pt_slot *s = realloc(t->slots[v], (size_t)(n + 1) * sizeof *s);
    if (!s)
        return herr_set(err, HERR_NOMEM, "pipeline: out of memory for slots");
    t->slots[v] = s;
    memset(&s[n], 0, sizeof s[n]);
    if (n == 0) {
        s[n].m = t->chunk[v];
    } else {
        int rc = model_clone(&s[n].m, t->chunk[v], err);
        if (rc)
            return herr_prefix(err, rc, "pipeline: activation slot %d of chunk %d", n, v);
    }
    s[n].micro = j;
    t->n_slots[v] = n + 1;
    *out = &s[n];
    return 0;
}

static pt_slot *slot_find(ptrain *t, int v, int j)
{
    for (int i = 0; i < t->n_slots[v]; i++)
        if (t->slots[v][i].micro == j)
            return &t->slots[v][i];
    return NULL;
}

static int tag_of(const ptrain *t, int j, int receiver_vs, int grad)
{
    return 2 * (j * t->n_virtual + receiver_vs) + grad;
}

static size_t act_floats(const ptrain *t, model *m, int j)
{
    const vlm_batch *b = &t->micro[j].view;
    return (size_t)model_local_tokens(m, b->n_seq * b->seq_len) * (size_t)t->Hd;
}

static int op_forward(ptrain *t, int j, int v, hearth_err *err)
{
    int pp = t->lay.pp, vs = v * pp + t->dec->coords.p;
    comm *pg = t->dec->group[PS_PP];
    pt_micro *mi = &t->micro[j];
    pt_slot *s = NULL;
    int rc = slot_acquire(t, v, j, &s, err);
    if (rc)
        return rc;
    const model_par *par = model_get_par(s->m);
    size_t nx = act_floats(t, s->m, j);
    const float *img = NULL;
    if (par->has_embed) {
        double e0 = pt_now_ms();
        if ((rc = pt_encode_before_forward(t, j, &img, err)))
            return rc;
        t->enc_ms += pt_now_ms() - e0;
    } else {
        if ((rc = pt_grow((void **)&s->xin, &s->cap_xin, nx, sizeof(float), err)) ||
            (rc = comm_recv(pg, s->xin, nx, COMM_F32, (vs - 1) % pp, tag_of(t, j, vs, 0),
                            err)))
            return herr_prefix(err, rc, "pipeline: micro batch %d, input of stage %d", j, vs);
    }
    double d0 = pt_now_ms();
    model_stats ms;
    memset(&ms, 0, sizeof ms);
    if ((rc = model_stage_forward(s->m, &mi->view, img, mi->n_units,
                                  par->has_embed ? NULL : s->xin, &ms, err)))
        return herr_prefix(err, rc, "micro batch %d, stage %d forward", j, vs);
    t->dec_ms += pt_now_ms() - d0;
    t->aux_sum += ms.aux_loss;
    if (par->has_head) {
        if (ms.n_targets != mi->data.n_targets)
            return herr_set(err, HERR_RUNTIME, "micro batch %d: the model counted %d target "
                            "tokens, the data has %ld", j, ms.n_targets, mi->data.n_targets);
        t->loss_sum += ms.loss_sum;
        return 0;
    }
    size_t n;
    const float *y = model_stage_output(s->m, &n);
    if (n != nx)
        return herr_set(err, HERR_RUNTIME, "pipeline: stage %d output has %zu floats, "
                        "expected %zu", vs, n, nx);
    return comm_send(pg, y, n, COMM_F32, (vs + 1) % pp, tag_of(t, j, vs + 1, 0), err);
}

static int op_backward(ptrain *t, int j, int v, hearth_err *err)
{
    int pp = t->lay.pp, vs = v * pp + t->dec->coords.p;
    comm *pg = t->dec->group[PS_PP];
    pt_micro *mi = &t->micro[j];
    pt_slot *s = slot_find(t, v, j);
    if (!s)
        return herr_set(err, HERR_RUNTIME, "pipeline: backward of micro batch %d on stage %d "
                        "before its forward", j, vs);
    const model_par *par = model_get_par(s->m);
    size_t nx = act_floats(t, s->m, j);
    const float *dy = NULL;
    int rc;
    if (!par->has_head) {
        if ((rc = pt_grow((void **)&t->xbuf, &t->cap_xbuf, nx, sizeof(float), err)) ||
            (rc = comm_recv(pg, t->xbuf, nx, COMM_F32, (vs + 1) % pp, tag_of(t, j, vs, 1),
                            err)))
            return herr_prefix(err, rc, "pipeline: micro batch %d, gradient of stage %d", j,
                               vs);
        dy = t->xbuf;
    }
    double d0 = pt_now_ms();
    float *img_grad = par->has_embed && mi->n_units > 0 ? mi->img_grad : NULL;
    if ((rc = model_stage_backward(s->m, dy, t->loss_scale, t->aux_scale, img_grad, err)))
        return herr_prefix(err, rc, "micro batch %d, stage %d backward", j, vs);
    t->dec_ms += pt_now_ms() - d0;
    s->micro = -1;
    if (par->has_embed) {
        double e0 = pt_now_ms();
        rc = pt_encode_after_backward(t, j, err);
        t->enc_ms += pt_now_ms() - e0;
        return rc;
    }
    size_t n;
    const float *dx = model_stage_input_grad(s->m, &n);
    if (n != nx)
        return herr_set(err, HERR_RUNTIME, "pipeline: stage %d input gradient has %zu "
                        "floats, expected %zu", vs, n, nx);
    return comm_send(pg, dx, n, COMM_F32, (vs - 1) % pp, tag_of(t, j, vs - 1, 1), err);
}

int pt_pipe_run(ptrain *t, hearth_err *err)
{
    for (int i = 0; i < t->n_ops; i++) {
        const pp_op *op = &t->ops[i];
        int rc = op->kind == PP_FORWARD ? op_forward(t, op->micro, op->chunk, err)
                                        : op_backward(t, op->micro, op->chunk, err);
        if (rc)
            return rc;
    }
    return 0;
}
