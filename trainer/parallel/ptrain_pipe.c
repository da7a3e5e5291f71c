/* ptrain_pipe.c - the decoder pipeline of one rank: its op list (pp_schedule), one
 * activation slot per micro batch in flight, and the activations and their gradients
 * sent between neighbouring virtual stages.
 *
 * Virtual stage vs = chunk * pp + stage; its input comes from vs - 1 and its output goes
 * to vs + 1, on the PP group's ranks (vs % pp).  A message to virtual stage r about micro
 * batch j has tag 2 * (j * n_virtual + r) (+1 for gradients), so every (peer, tag) pair
 * is used once per step and the order of sends never matters (sends are buffered).
 *
 * Units (parallel.a2a_overlap, docs/parallel/a2a_overlap.md).  The schedule's ops work on
 * units of t->unit consecutive micro batches: 1 normally; 2 when the overlap is on and
 * the decoder has MoE layers, so that a unit's forward and backward run its two micro
 * batches as a pair (model_stage_forward_pair: the all_to_allv of one between the other's
 * compute); the last unit of an odd count has one.  Every stage and every rank of a DP
 * (hence EP) group builds the same units, so matched collectives stay matched.  Inputs,
 * outputs and gradients still travel per micro batch.
 *
 * Sequence chunks (parallel.chunks = K > 1, docs/parallel/chunks.md).  A unit is one
 * chunk: unit q is chunk q % K of micro batch q / K, and slots, tags and messages are per
 * unit.  The op list is not 1F1B: per micro batch, every stage runs the forwards of its
 * chunks 0 .. K-1 (for each, its virtual stages in order), then their backwards K-1 .. 0
 * (virtual stages in reverse), and only then the next micro batch: a chunk's attention
 * reads the key/value cache the earlier chunks left in the stage's model (one micro batch
 * in flight per model chunk), and its backward adds to the cache's gradient the earlier
 * chunks then read.  Every dependency (the previous virtual stage's output, the next one's
 * gradient, the earlier chunks' cache) comes earlier in this one global order, which
 * every stage follows, so no stage waits on one that waits on it.  The pipeline overlaps
 * the chunks of a micro batch (GPipe inside the micro batch); the a2a_overlap pairing is
 * not used. */
#include "parallel/ptrain_internal.h"

#include <stdlib.h>
#include <string.h>

int pt_pipe_init(ptrain *t, hearth_err *err)
{
    const run_config *c = &t->cfg;
    t->K = c->parallel.chunks > 1 ? c->parallel.chunks : 1;
    t->unit = c->parallel.a2a_overlap && c->model.decoder.moe_experts > 0 && t->K == 1 ? 2 : 1;
    int units = t->K > 1 ? t->M_local * t->K : (t->M_local + t->unit - 1) / t->unit;
    int cap = 2 * units * t->vpp;
    t->ops = calloc((size_t)(cap > 0 ? cap : 1), sizeof *t->ops);
    t->slots = calloc((size_t)t->vpp, sizeof *t->slots);
    t->n_slots = calloc((size_t)t->vpp, sizeof *t->n_slots);
    if (!t->ops || !t->slots || !t->n_slots)
        return herr_set(err, HERR_NOMEM, "pipeline: out of memory");
    if (t->K > 1) {
        int n = 0;
        for (int j = 0; j < t->M_local; j++) {
            for (int q = j * t->K; q < (j + 1) * t->K; q++)
                for (int v = 0; v < t->vpp; v++)
                    t->ops[n++] = (pp_op){ PP_FORWARD, q, v };
            for (int q = (j + 1) * t->K - 1; q >= j * t->K; q--)
                for (int v = t->vpp - 1; v >= 0; v--)
                    t->ops[n++] = (pp_op){ PP_BACKWARD, q, v };
        }
        t->n_ops = n;
        return 0;
    }
    /* The same op lists on every stage, checked for deadlocks before anything runs. */
    int rc = pp_schedule_check(t->lay.pp, t->vpp, units, NULL, err);
    if (rc)
        return rc;
    int n = pp_schedule_build(t->ops, cap, t->lay.pp, t->vpp, t->dec->coords.p, units, err);
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

/* Floats of the stage activations of unit j (under chunks: of its chunk; the model was
 * told its chunk, model_local_tokens divides by K). */
static size_t act_floats(const ptrain *t, model *m, int j)
{
    const vlm_batch *b = &t->micro[j / t->K].view;
    return (size_t)model_local_tokens(m, b->n_seq * b->seq_len) * (size_t)t->Hd;
}

/* Micro batches [*j0, *j0 + return) of unit u. */
static int unit_micros(const ptrain *t, int u, int *j0)
{
    *j0 = u * t->unit;
    int n = t->M_local * t->K - *j0;   /* K > 1: unit = 1, a unit is a chunk */
    return n < t->unit ? n : t->unit;
}

/* Takes a slot for micro batch j on chunk v, gets its input (embeddings from the encoder
 * strategy, or the previous stage's output) and begins its stage forward. */
static int forward_begin(ptrain *t, int j, int v, pt_slot **out, hearth_err *err)
{
    int pp = t->lay.pp, vs = v * pp + t->dec->coords.p;
    int mj = j / t->K, ck = j % t->K;   /* micro batch and chunk of unit j */
    pt_micro *mi = &t->micro[mj];
    pt_slot *s = NULL;
    int rc = slot_acquire(t, v, j, &s, err);
    if (rc)
        return rc;
    *out = s;
    if (t->K > 1 && (rc = model_stage_set_chunk(s->m, ck, t->K, err)))
        return rc;
    const model_par *par = model_get_par(s->m);
    size_t nx = act_floats(t, s->m, j);
    const float *img = NULL;
    if (par->has_embed && ck > 0) {
        img = t->chunk_img;   /* the encode of the micro batch's chunk 0 */
    } else if (par->has_embed) {
        double e0 = pt_now_ms();
        if ((rc = pt_encode_before_forward(t, mj, &img, err)))
            return rc;
        t->enc_ms += pt_now_ms() - e0;
        t->chunk_img = img;
    } else {
        if ((rc = pt_grow((void **)&s->xin, &s->cap_xin, nx, sizeof(float), err)) ||
            (rc = comm_recv(t->dec->group[PS_PP], s->xin, nx, COMM_F32, (vs - 1) % pp,
                            tag_of(t, j, vs, 0), err)))
            return herr_prefix(err, rc, "pipeline: micro batch %d, input of stage %d", j, vs);
    }
    double d0 = pt_now_ms();
    /* img is only valid until the next pt_encode_before_forward: begin copies it. */
    rc = model_stage_forward_begin(s->m, &mi->view, img, mi->n_units,
                                   par->has_embed ? NULL : s->xin, err);
    t->dec_ms += pt_now_ms() - d0;
    if (rc)
        return herr_prefix(err, rc, "micro batch %d, stage %d forward", j, vs);
    return 0;
}

/* After the forward of micro batch j: its loss (head) or its output to the next stage. */
static int forward_end(ptrain *t, int j, int v, pt_slot *s, const model_stats *ms,
                       hearth_err *err)
{
    int pp = t->lay.pp, vs = v * pp + t->dec->coords.p;
    pt_micro *mi = &t->micro[j / t->K];
    t->aux_sum += ms->aux_loss;
    if (model_get_par(s->m)->has_head && t->K > 1) {
        /* the chunks' targets add up to the micro batch's */
        t->chunk_targets = (j % t->K ? t->chunk_targets : 0) + ms->n_targets;
        t->loss_sum += ms->loss_sum;
        if (j % t->K == t->K - 1 && t->chunk_targets != mi->data.n_targets)
            return herr_set(err, HERR_RUNTIME, "micro batch %d: the model counted %ld target "
                            "tokens over %d chunks, the data has %ld", j / t->K,
                            t->chunk_targets, t->K, mi->data.n_targets);
        return 0;
    }
    if (model_get_par(s->m)->has_head) {
        if (ms->n_targets != mi->data.n_targets)
            return herr_set(err, HERR_RUNTIME, "micro batch %d: the model counted %d target "
                            "tokens, the data has %ld", j, ms->n_targets, mi->data.n_targets);
        t->loss_sum += ms->loss_sum;
        return 0;
    }
    size_t n, nx = act_floats(t, s->m, j);
    const float *y = model_stage_output(s->m, &n);
    if (n != nx)
        return herr_set(err, HERR_RUNTIME, "pipeline: stage %d output has %zu floats, "
                        "expected %zu", vs, n, nx);
    return comm_send(t->dec->group[PS_PP], y, n, COMM_F32, (vs + 1) % pp,
                     tag_of(t, j, vs + 1, 0), err);
}

static int op_forward(ptrain *t, int u, int v, hearth_err *err)
{
    int vs = v * t->lay.pp + t->dec->coords.p, j0, rc;
    int n = unit_micros(t, u, &j0);
    pt_slot *s[2] = { NULL, NULL };
    model *m[2] = { NULL, NULL };
    model_stats ms[2];
    memset(ms, 0, sizeof ms);
    for (int i = 0; i < n; i++) {
        if ((rc = forward_begin(t, j0 + i, v, &s[i], err)))
            return rc;
        m[i] = s[i]->m;
    }
    /* A slot taken later may have moved the slot array. */
    for (int i = 0; i < n; i++)
        s[i] = slot_find(t, v, j0 + i);
    double d0 = pt_now_ms();
    rc = model_stage_forward_pair(m, ms, err);
    t->dec_ms += pt_now_ms() - d0;
    if (rc)
        return n > 1 ? herr_prefix(err, rc, "micro batches %d and %d, stage %d forward", j0,
                                   j0 + 1, vs)
                     : herr_prefix(err, rc, "micro batch %d, stage %d forward", j0, vs);
    for (int i = 0; i < n; i++)
        if ((rc = forward_end(t, j0 + i, v, s[i], &ms[i], err)))
            return rc;
    return 0;
}

static int op_backward(ptrain *t, int u, int v, hearth_err *err)
{
    int pp = t->lay.pp, vs = v * pp + t->dec->coords.p, j0, rc;
    int n = unit_micros(t, u, &j0);
    comm *pg = t->dec->group[PS_PP];
    pt_slot *s[2] = { NULL, NULL };
    model *m[2] = { NULL, NULL };
    const float *dy[2] = { NULL, NULL };
    float *img_grad[2] = { NULL, NULL };
    for (int i = 0; i < n; i++) {
        int j = j0 + i;
        pt_micro *mi = &t->micro[j / t->K];
        if (!(s[i] = slot_find(t, v, j)))
            return herr_set(err, HERR_RUNTIME, "pipeline: backward of micro batch %d on "
                            "stage %d before its forward", j, vs);
        m[i] = s[i]->m;
        const model_par *par = model_get_par(m[i]);
        if (par->has_embed && mi->n_units > 0)
            img_grad[i] = mi->img_grad;
        if (par->has_head)
            continue;
        /* The slot's input buffer is free since the forward copied it. */
        size_t nx = act_floats(t, m[i], j);
        if ((rc = pt_grow((void **)&s[i]->xin, &s[i]->cap_xin, nx, sizeof(float), err)) ||
            (rc = comm_recv(pg, s[i]->xin, nx, COMM_F32, (vs + 1) % pp, tag_of(t, j, vs, 1),
                            err)))
            return herr_prefix(err, rc, "pipeline: micro batch %d, gradient of stage %d", j,
                               vs);
        dy[i] = s[i]->xin;
    }
    double d0 = pt_now_ms();
    rc = model_stage_backward_pair(m, dy, t->loss_scale, t->aux_scale, img_grad, err);
    t->dec_ms += pt_now_ms() - d0;
    if (rc)
        return n > 1 ? herr_prefix(err, rc, "micro batches %d and %d, stage %d backward", j0,
                                   j0 + 1, vs)
                     : herr_prefix(err, rc, "micro batch %d, stage %d backward", j0, vs);
    for (int i = 0; i < n; i++) {
        int j = j0 + i;
        s[i]->micro = -1;
        if (model_get_par(m[i])->has_embed) {
            if (j % t->K)   /* chunks: the encoder backward after chunk 0's */
                continue;
            double e0 = pt_now_ms();
            rc = pt_encode_after_backward(t, j / t->K, err);
            t->enc_ms += pt_now_ms() - e0;
            if (rc)
                return rc;
            continue;
        }
        size_t nd, nx = act_floats(t, m[i], j);
        const float *dx = model_stage_input_grad(m[i], &nd);
        if (nd != nx)
            return herr_set(err, HERR_RUNTIME, "pipeline: stage %d input gradient has %zu "
                            "floats, expected %zu", vs, nd, nx);
        if ((rc = comm_send(pg, dx, nd, COMM_F32, (vs - 1) % pp, tag_of(t, j, vs - 1, 1),
                            err)))
            return rc;
    }
    return 0;
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
