/* mem_plan.c - the memory plan of one rank (mem_plan.h): its parameter shards, optimizer
 * buckets, the pipeline schedule's micro batches in flight, and the activation buffers
 * (mem_plan_act.c) of each.  The tensor list mirrors trainer/model/model_reg.c and the
 * buckets trainer/parallel/param_sync.c; test_mem_plan compares both with the trainer. */
#include <stdlib.h>
#include <string.h>

#include "shape/mem_plan.h"
#include "shape/mem_plan_parts.h"

static const char *const cat_names[MEM_CATEGORIES] = {
    "params", "grads", "optimizer", "opt_buffers", "activations", "moe", "logits", "stage",
    "encoder", "embeddings", "inputs",
};

const char *mem_category_name(mem_category k)
{
    return k >= 0 && k < MEM_CATEGORIES ? cat_names[k] : "?";
}

/* ---- the rank ------------------------------------------------------------------------- */

typedef struct {
    const run_config *c;
    int tp, cp, pp, vpp, dp, ep, etp, world, nv;
    int t, cc, d, p;            /* coordinates (parallel_state.h rank order) */
    int enc_here;               /* the encoder lives on this rank (chunk 0) */
    int M_local, unit, units;
    int K;                      /* parallel.chunks (>= 1) */
    int64_t N, Nl;              /* decoder tokens per micro batch on this rank, local rows */
    int64_t U_mb, P_mb;         /* image units and patches per micro batch (upper bound) */
} rank_ctx;

/* Sequence samples of the data keys: the most merge units one sequence can carry. */
static int64_t units_per_sequence(const run_config *c)
{
    const encoder_shape *e = &c->model.encoder;
    if (!e->present || c->data.images_max < 1)
        return 0;
    int u = e->patch * e->spatial_merge;
    int side = (c->data.image_px_max + u / 2) / u;    /* data_synth.c px_to_units */
    if (side < 1)
        side = 1;
    int64_t units = (int64_t)c->data.images_max * side * side;
    int64_t room = c->train.seq_len > 1 ? c->train.seq_len - 1 : 0;
    return units < room ? units : room;
}

static int rank_init(rank_ctx *x, const run_config *c, int rank, hearth_err *err)
{
    memset(x, 0, sizeof *x);
    x->c = c;
    x->tp = c->parallel.tp;
    x->cp = c->parallel.cp;
    x->pp = c->parallel.pp;
    x->vpp = c->parallel.vpp > 1 ? c->parallel.vpp : 1;
    x->dp = c->parallel.dp;
    x->ep = c->parallel.ep;
    x->etp = c->parallel.encoder.tp;
    x->world = x->tp * x->cp * x->dp * x->pp;
    x->nv = x->pp * x->vpp;
    if (x->tp < 1 || x->cp < 1 || x->pp < 1 || x->dp < 1 || x->ep < 1 || x->etp < 1 ||
        x->world != c->ranks)
        return herr_set(err, HERR_CONFIG, "parallel: the layout tp %d x cp %d x dp %d x pp %d "
                        "does not match ranks %d", x->tp, x->cp, x->dp, x->pp, c->ranks);
    if (rank < 0 || rank >= x->world)
        return herr_set(err, HERR_CONFIG, "memory plan: rank %d is outside 0..%d", rank,
                        x->world - 1);
    if (c->model.decoder.s.layers % x->nv)
        return herr_set(err, HERR_CONFIG, "model.decoder.layers: %d layers do not split into "
                        "pp x vpp = %d stages", c->model.decoder.s.layers, x->nv);
    int mb = c->train.micro_batch, gb = c->train.global_batch;
    if (mb < 1 || gb < 1 || gb % mb || (gb / mb) % x->dp)
        return herr_set(err, HERR_CONFIG, "train.global_batch: %d is not a multiple of "
                        "micro_batch %d x dp %d", gb, mb, x->dp);
    x->t = rank % x->tp;
    x->cc = rank / x->tp % x->cp;
    x->d = rank / (x->tp * x->cp) % x->dp;
    x->p = rank / (x->tp * x->cp * x->dp);
    x->M_local = gb / mb / x->dp;
    x->K = c->parallel.chunks > 1 ? c->parallel.chunks : 1;
    x->unit = c->parallel.a2a_overlap && c->model.decoder.moe_experts > 0 && x->K == 1 ? 2 : 1;
    x->units = (x->M_local + x->unit - 1) / x->unit;
    x->enc_here = c->model.encoder.present &&
                  (c->parallel.encoder.strategy == ENC_FULL_SEPARATION || x->p == 0);
    /* Context parallelism splits the sequence, chunks cut it (a stage runs one chunk at
     * a time); sequence parallelism the residual rows. */
    x->N = (int64_t)mb * c->train.seq_len / x->cp / x->K;
    x->Nl = c->parallel.sp && x->tp > 1 ? x->N / x->tp : x->N;
    int merge = c->model.encoder.spatial_merge;
    x->U_mb = (int64_t)mb * units_per_sequence(c);
    x->P_mb = x->U_mb * merge * merge;
    return 0;
}

/* ---- parameters and the optimizer's buckets ------------------------------------------- */

enum { REP_ENC = 0, REP_EXPERT = 1, REP_DENSE = 2, REP_KINDS };
enum { SUM_TP_ENC, SUM_TP_DEC, SUM_KV_ENC, SUM_KV_DEC, SUM_TIED, SUM_KINDS };

typedef struct {
    int64_t params;
    int64_t bucket[REP_KINDS];      /* trainable elements per replica bucket */
    int64_t sum[SUM_KINDS];         /* elements packed for the gradient sums */
} tally;

/* One tensor: numel local elements; kv: elements of the k and v rows when they are
 * replicated over kv_rep ranks; partial: summed over the component's tp group. */
static void tensor(tally *tl, int enc, int frozen, int expert, int64_t numel, int partial,
                   int64_t kv, int tied)
{
    tl->params += numel;
    if (frozen)
        return;
    tl->bucket[enc ? REP_ENC : expert ? REP_EXPERT : REP_DENSE] += numel;
    if (partial)
        tl->sum[enc ? SUM_TP_ENC : SUM_TP_DEC] += numel;
    if (kv)
        tl->sum[enc ? SUM_KV_ENC : SUM_KV_DEC] += kv;
    if (tied)
        tl->sum[SUM_TIED] += numel;
}

static void norm(tally *tl, int enc, int frozen, norm_kind k, int64_t C, int partial)
{
    tensor(tl, enc, frozen, 0, C, partial, 0, 0);
    if (k == NORM_LAYERNORM)
        tensor(tl, enc, frozen, 0, C, partial, 0, 0);
}

/* model_reg.c reg_block: one block of a stack split as st says. */
static void block_tensors(tally *tl, const mp_stack *st, int enc, int moe)
{
    const stack_shape *s = st->s;
    int fz = s->freeze != 0, tp = st->tp;
    int rep_sp = st->sp;                        /* norms, row biases: partial under sp */
    int64_t H = st->H, kvw = st->kv_rep > 1 ? 2 * (int64_t)st->KD * H : 0;
    int64_t kvb = st->kv_rep > 1 ? 2 * (int64_t)st->KD : 0;
    norm(tl, enc, fz, s->norm, H, rep_sp);
    tensor(tl, enc, fz, 0, st->QKV * H, 0, kvw, 0);
    if (s->bias_qkv)
        tensor(tl, enc, fz, 0, st->QKV, 0, kvb, 0);
    if (s->qk_norm) {
        tensor(tl, enc, fz, 0, st->D, tp > 1, 0, 0);
        tensor(tl, enc, fz, 0, st->D, tp > 1, 0, 0);
    }
    tensor(tl, enc, fz, 0, H * st->QD, 0, 0, 0);
    if (s->bias_proj)
        tensor(tl, enc, fz, 0, H, rep_sp, 0, 0);
    norm(tl, enc, fz, s->norm, H, rep_sp);
    if (moe) {
        tensor(tl, enc, fz, 0, (int64_t)st->E * H, 0, 0, 0);
        tensor(tl, enc, fz, 1, (int64_t)st->El * 2 * st->Fm * H, 0, 0, 0);
        tensor(tl, enc, fz, 1, (int64_t)st->El * H * st->Fm, 0, 0, 0);
        if (st->Fs > 0) {
            tensor(tl, enc, fz, 0, 2 * (int64_t)st->Fs * H, 0, 0, 0);
            tensor(tl, enc, fz, 0, H * st->Fs, 0, 0, 0);
        }
        return;
    }
    tensor(tl, enc, fz, 0, (int64_t)st->Fu * H, 0, 0, 0);
    if (s->bias_mlp)
        tensor(tl, enc, fz, 0, st->Fu, 0, 0, 0);
    tensor(tl, enc, fz, 0, H * st->F, 0, 0, 0);
    if (s->bias_mlp)
        tensor(tl, enc, fz, 0, H, rep_sp, 0, 0);
}

static void dec_stack(const rank_ctx *x, mp_stack *st)
{
    const decoder_shape *d = &x->c->model.decoder;
    mp_stack_init(st, &d->s, x->tp, x->c->parallel.sp, d->moe_experts, d->moe_top_k,
                  d->moe_ffn, d->moe_shared_ffn, x->ep, d->moe_every);
    st->cp = x->cp;
    st->chunks = x->K;
    st->gpu = x->c->device == DEVICE_CUDA;
}

static void enc_stack(const rank_ctx *x, mp_stack *st)
{
    mp_stack_init(st, &x->c->model.encoder.s, x->etp, 0, 0, 0, 0, 0, 1, 1);
}

static int64_t vocab_slice(const rank_ctx *x, int t)
{
    int64_t V = x->c->model.decoder.vocab;
    return (int64_t)(t + 1) * V / x->tp - (int64_t)t * V / x->tp;
}

/* model_reg.c reg_all for chunk v of this rank. */
static void chunk_tensors(tally *tl, const rank_ctx *x, int v)
{
    const model_shape *m = &x->c->model;
    const decoder_shape *d = &m->decoder;
    int vs = v * x->pp + x->p, per = d->s.layers / x->nv;
    if (v == 0 && x->enc_here) {
        const encoder_shape *e = &m->encoder;
        mp_stack st;
        enc_stack(x, &st);
        int fz = e->s.freeze != 0;
        int64_t pdim = (int64_t)e->in_channels * e->temporal_patch * e->patch * e->patch;
        tensor(tl, 1, fz, 0, (int64_t)e->s.hidden * pdim, 0, 0, 0);
        for (int l = 0; l < e->s.layers; l++)
            block_tensors(tl, &st, 1, 0);
        /* the projector trains even with a frozen encoder */
        int64_t in = (int64_t)e->spatial_merge * e->spatial_merge * e->s.hidden;
        const projector_shape *pj = &m->projector;
        norm(tl, 1, 0, pj->norm, e->s.hidden, 0);
        tensor(tl, 1, 0, 0, pj->hidden * in, 0, 0, 0);
        if (pj->bias)
            tensor(tl, 1, 0, 0, pj->hidden, 0, 0, 0);
        tensor(tl, 1, 0, 0, (int64_t)d->s.hidden * pj->hidden, 0, 0, 0);
        if (pj->bias)
            tensor(tl, 1, 0, 0, d->s.hidden, 0, 0, 0);
    }
    mp_stack st;
    dec_stack(x, &st);
    int fz = d->s.freeze != 0, has_embed = vs == 0, has_head = vs == x->nv - 1;
    int64_t H = d->s.hidden, Vl = vocab_slice(x, x->t);
    int tied_pp = d->tied_embeddings && x->pp > 1;
    if (has_embed)
        tensor(tl, 0, fz, 0, Vl * H, 0, 0, tied_pp && x->p == 0);
    if (has_embed && d->s.pos == POS_LEARNED)
        tensor(tl, 0, fz, 0, (int64_t)d->max_positions * H, 0, 0, 0);
    for (int l = 0; l < per; l++) {
        int gl = vs * per + l;
        block_tensors(tl, &st, 0, d->moe_experts > 0 && gl % d->moe_every == d->moe_every - 1);
    }
    if (!has_head)
        return;
    norm(tl, 0, fz, d->s.norm, H, st.sp);
    if (d->tied_embeddings && has_embed)
        return;
    tensor(tl, 0, fz, 0, Vl * H, 0, 0, d->tied_embeddings);
}

/* The rank's position in each replica group (parallel_state.h: members in world-rank
 * order) and the group's size. */
static void replica_of(const rank_ctx *x, int k, int *idx, int *size)
{
    int q = x->d / x->ep;          /* dp index d = q * ep + e (parallel_state.h) */
    if (k == REP_DENSE) {
        *size = x->cp * x->dp;
        *idx = x->cc + x->cp * x->d;
    } else if (k == REP_EXPERT) {
        *size = x->cp * x->dp / x->ep;
        *idx = q * x->cp + x->cc;
    } else if (x->c->parallel.encoder.strategy == ENC_FULL_SEPARATION) {
        *size = x->world / x->etp;
        int r = x->t + x->tp * (x->cc + x->cp * (x->d + x->dp * x->p));
        *idx = r / x->etp;
    } else {
        int R = x->tp / x->etp;
        *size = R * x->cp * x->dp;
        *idx = (x->d * x->cp + x->cc) * R + x->t / x->etp;
    }
}

/* ---- the pipeline replay -------------------------------------------------------------- */

/* pp_schedule.c table_entry / fwd_op / bwd_op for units. */
static void table_entry(int pp, int vpp, int M, int k, int *micro, int *chunk)
{
    if (vpp == 1) {
        *micro = k;
        *chunk = 0;
        return;
    }
    int full = M / pp > 0 ? M / pp - 1 : 0, gsz = pp * vpp;
    if (k < full * gsz) {
        *chunk = k % gsz / pp;
        *micro = k / gsz * pp + k % gsz % pp;
    } else {
        int last = M - full * pp, i = k - full * gsz;
        *chunk = i / last;
        *micro = full * pp + i % last;
    }
}

typedef struct {
    int *cur, *max;             /* [vpp] micro batches in flight per chunk */
    int R, replica;             /* encode groups: size, this rank's replica (-1: none) */
    int any;                    /* the ViT balance may hand any replica images */
    int enc_cur, enc_max;
} replay_state;

static void on_op(replay_state *rs, const rank_ctx *x, int fwd, int u, int v)
{
    int j0 = u * x->unit, n = x->M_local - j0 < x->unit ? x->M_local - j0 : x->unit;
    rs->cur[v] += fwd ? n : -n;
    if (rs->cur[v] > rs->max[v])
        rs->max[v] = rs->cur[v];
    if (v != 0 || x->p != 0 || rs->replica < 0)
        return;
    /* ptrain_encode.c: a group of R micro batches is encoded at its first forward and
     * held until its last backward; replica r encodes only when the group has r + 1. */
    for (int j = j0; j < j0 + n; j++) {
        int first = j - j % rs->R, count = x->M_local - first < rs->R ? x->M_local - first
                                                                       : rs->R;
        if (rs->replica >= count && !rs->any)
            continue;
        if (fwd && j == first && ++rs->enc_cur > rs->enc_max)
            rs->enc_max = rs->enc_cur;
        if (!fwd && j == first + count - 1)
            rs->enc_cur--;
    }
}

/* ptrain_pipe.c under chunks: per micro batch the forwards of its K chunks (virtual
 * stages in order), then their backwards; the encoder sees the micro batch at its chunk
 * 0's forward and backward (one unit of one micro batch each). */
static void replay_chunks(const rank_ctx *x, replay_state *rs)
{
    for (int j = 0; j < x->M_local; j++) {
        for (int k = 0; k < x->K; k++)
            for (int v = 0; v < x->vpp; v++) {
                if (k == 0)
                    on_op(rs, x, 1, j, v);
                else if (++rs->cur[v] > rs->max[v])
                    rs->max[v] = rs->cur[v];
            }
        for (int k = x->K - 1; k >= 0; k--)
            for (int v = x->vpp - 1; v >= 0; v--) {
                if (k == 0)
                    on_op(rs, x, 0, j, v);
                else
                    rs->cur[v]--;
            }
    }
}

static int replay(const rank_ctx *x, replay_state *rs, hearth_err *err)
{
    if (x->K > 1) {
        replay_chunks(x, rs);
        return 0;
    }
    int pp = x->pp, vpp = x->vpp, M = x->units, p = x->p;
    int64_t total64 = (int64_t)M * vpp;
    if (total64 * pp > INT32_MAX / 2)
        return herr_set(err, HERR_CONFIG, "train.global_batch: %d micro batches x vpp %d x "
                        "pp %d are too many for the pipeline schedule", M, vpp, pp);
    int total = (int)total64;
    int gmax = M < pp ? M : pp + M % pp;
    int warm = vpp == 1 ? pp - p - 1 : (pp - p - 1) * 2 + (vpp - 1) * gmax;
    if (warm > total)
        warm = total;
    int u, ch;
    for (int k = 0; k < total; k++) {
        if (k >= warm) {
            /* steady state: the backward of k - warm after the forward of k */
            table_entry(pp, vpp, M, k, &u, &ch);
            on_op(rs, x, 1, u, ch);
            table_entry(pp, vpp, M, k - warm, &u, &ch);
            on_op(rs, x, 0, u, vpp - 1 - ch);
        } else {
            table_entry(pp, vpp, M, k, &u, &ch);
            on_op(rs, x, 1, u, ch);
        }
    }
    for (int k = total - warm; k < total; k++) {
        table_entry(pp, vpp, M, k, &u, &ch);
        on_op(rs, x, 0, u, vpp - 1 - ch);
    }
    return 0;
}

/* ---- one rank ------------------------------------------------------------------------- */

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* The encodes of this rank: how many at once (enc_slots) and patches / units of each. */
static void encode_share(const rank_ctx *x, const replay_state *rs, mem_rank_plan *out,
                         int64_t *P, int64_t *U)
{
    const run_config *c = x->c;
    /* per_img_units / imgs_mb: merge units of one image at most */
    int64_t per_img_units = x->U_mb, imgs_mb = (int64_t)c->train.micro_batch *
                                               (c->data.images_max > 0 ? c->data.images_max : 0);
    *P = *U = 0;
    out->enc_slots = 0;
    if (!x->enc_here || x->U_mb == 0)
        return;
    int bal = c->parallel.encoder.balance;
    if (c->parallel.encoder.strategy == ENC_FULL_SEPARATION) {
        /* micro j goes to model-parallel rank j % size (tp x cp x pp ranks) */
        int size = x->tp * x->cp * x->pp, me = x->t + x->tp * (x->cc + x->cp * x->p);
        int64_t mine = x->M_local / size + (me < x->M_local % size);
        int64_t u = mine * x->U_mb;
        if (bal && size > 1 && imgs_mb > 0) {
            /* rebalanced images: up to one image more than an even share */
            int64_t imgs = ceil_div((int64_t)x->M_local * imgs_mb, size) + 1;
            int64_t ub = imgs * ceil_div(per_img_units, imgs_mb);
            if (ub > u)
                u = ub < x->M_local * x->U_mb ? ub : x->M_local * x->U_mb;
        }
        if (u == 0)
            return;
        out->enc_slots = 1;
        *U = u;
    } else {
        if (rs->enc_max == 0)
            return;
        out->enc_slots = rs->enc_max;
        int64_t u = x->U_mb;
        int R = rs->R;
        if (bal && R > 1 && imgs_mb > 0) {
            /* a group of at most R micro batches over R replicas: an even share is one
             * micro batch's images, plus one */
            int64_t ub = (imgs_mb + 1) * ceil_div(per_img_units, imgs_mb);
            if (ub > u)
                u = ub < R * x->U_mb ? ub : R * x->U_mb;
        }
        *U = u;
    }
    int merge = c->model.encoder.spatial_merge;
    *P = *U * merge * merge;
}

int mem_plan_rank(const run_config *c, int rank, mem_rank_plan *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    rank_ctx x;
    int rc = rank_init(&x, c, rank, err);
    if (rc)
        return rc;
    out->rank = rank;
    out->t = x.t;
    out->c = x.cc;
    out->d = x.d;
    out->p = x.p;
    out->has_encoder = x.enc_here;

    /* parameters, gradients, optimizer */
    tally tl;
    memset(&tl, 0, sizeof tl);
    for (int v = 0; v < x.vpp; v++)
        chunk_tensors(&tl, &x, v);
    int zero = c->parallel.distributed_optimizer;
    int64_t owned = 0, flat = 0, sums = 0;
    for (int k = 0; k < REP_KINDS; k++) {
        int idx, size;
        replica_of(&x, k, &idx, &size);
        int64_t total = tl.bucket[k];
        if (!zero || size <= 1) {
            owned += total;
            flat += total;
            continue;
        }
        int64_t chunk = ceil_div(total, size), lo = idx * chunk < total ? idx * chunk : total;
        int64_t hi = lo + chunk < total ? lo + chunk : total;
        owned += hi - lo;
        flat += chunk * size;
    }
    for (int k = 0; k < SUM_KINDS; k++)
        sums += tl.sum[k];
    out->params = tl.params;
    out->opt_owned = owned;

    /* the schedule */
    replay_state rs;
    memset(&rs, 0, sizeof rs);
    rs.cur = calloc((size_t)x.vpp, sizeof *rs.cur);
    rs.max = calloc((size_t)x.vpp, sizeof *rs.max);
    if (!rs.cur || !rs.max) {
        free(rs.cur);
        free(rs.max);
        return herr_set(err, HERR_NOMEM, "memory plan: out of memory");
    }
    rs.replica = -1;
    if (x.enc_here && c->parallel.encoder.strategy != ENC_FULL_SEPARATION) {
        rs.R = x.tp / x.etp;
        rs.replica = x.t / x.etp;
        rs.any = c->parallel.encoder.balance && rs.R > 1;
    }
    rc = replay(&x, &rs, err);

    /* activations: every slot of every chunk carves the same buffers */
    mp_elems el;
    memset(&el, 0, sizeof el);
    mp_stack dst;
    dec_stack(&x, &dst);
    int per = c->model.decoder.s.layers / x.nv;
    int64_t Vmax = ceil_div(c->model.decoder.vocab, x.tp), Vl = vocab_slice(&x, x.t);
    for (int v = 0; !rc && v < x.vpp; v++) {
        int vs = v * x.pp + x.p, first = vs * per, has_head = vs == x.nv - 1;
        int slots = rs.max[v];
        out->slots += slots;
        if (slots > 0)
            out->chunk_cache_floats += mp_chunk_cache(&el, &dst, per, x.N);
        for (int s = 0; s < slots; s++) {
            mp_stack_arena(&el, &dst, per, first, x.N, x.Nl, MEM_ACTIVATIONS);
            mp_stage_buffers(&el, &dst, has_head, x.N, x.N * x.cp * x.K, x.Nl, Vl, Vmax);
            mp_moe_exchange(&el, &dst, per, first, x.N * dst.K);
            if (vs > 0 || !has_head)     /* the received stage input / output gradient */
                el.f[MEM_STAGE] += x.Nl * dst.H;
        }
    }
    free(rs.cur);
    free(rs.max);
    if (rc)
        return rc;

    /* the encoder, its embeddings, the inputs */
    int64_t P, U, Hd = c->model.decoder.s.hidden;
    encode_share(&x, &rs, out, &P, &U);
    out->encodes = out->enc_slots > 0;
    if (out->enc_slots > 0) {
        mp_stack est;
        enc_stack(&x, &est);
        const encoder_shape *e = &c->model.encoder;
        int64_t pdim = (int64_t)e->in_channels * e->temporal_patch * e->patch * e->patch;
        for (int s = 0; s < out->enc_slots; s++)
            mp_encode_buffers(&el, &est, &c->model, P, U);
        el.f[MEM_ENCODER] += P * pdim;           /* the pixels of the images it encodes */
    }
    int64_t step_rows = (int64_t)x.M_local * x.U_mb * Hd, host = 0;
    if (c->model.encoder.present && x.U_mb > 0) {
        if (c->parallel.encoder.strategy == ENC_FULL_SEPARATION) {
            /* every rank: the gathered rows, the image gradients; the embeddings
             * themselves on the host with offload (one working micro batch here) */
            el.f[MEM_EMBEDDINGS] += 2 * step_rows;
            if (c->parallel.encoder.offload) {
                host += step_rows;
                el.f[MEM_EMBEDDINGS] += x.U_mb * Hd;
            } else {
                el.f[MEM_EMBEDDINGS] += step_rows;
            }
        } else if (x.p == 0) {
            /* stage 0: embeddings and gradients per micro batch, the group gather */
            el.f[MEM_EMBEDDINGS] += 2 * step_rows + (int64_t)(x.tp / x.etp) * x.U_mb * Hd;
        }
    }
    el.i[MEM_INPUTS] += 2 * (int64_t)x.M_local * c->train.micro_batch * c->train.seq_len;
    if (c->model.encoder.present) {
        const encoder_shape *e = &c->model.encoder;
        int64_t pdim = (int64_t)e->in_channels * e->temporal_patch * e->patch * e->patch;
        el.f[MEM_INPUTS] += (int64_t)x.M_local * x.P_mb * pdim;
    }
    out->stack_arena_floats = el.arena_floats;

    /* bytes */
    int cuda = c->device == DEVICE_CUDA;
    int64_t act = cuda ? 2 : 4, w = cuda ? 2 : 4;
    out->bytes[MEM_PARAMS] = tl.params * w;
    out->bytes[MEM_GRADS] = tl.params * 4;
    out->bytes[MEM_OPTIMIZER] = owned * (cuda ? 12 : 8);
    /* cpu: param_sync's flat gradient and parameter buckets are copies; cuda (assumed,
     * Megatron-style): gradients are reduced in place in their contiguous buffer and
     * parameters all-gathered into the bf16 weights, so only the sum packing remains */
    out->bytes[MEM_OPT_BUFFERS] = (cuda ? 0 : flat * 8) + sums * 4;
    for (int k = MEM_ACTIVATIONS; k < MEM_CATEGORIES; k++)
        out->bytes[k] = el.f[k] * act + el.i[k] * 4;
    out->bytes[MEM_LOGITS] += el.logit_floats * 4 + el.lse_doubles * 8;
    out->host_bytes = host * act;
    for (int k = 0; k < MEM_CATEGORIES; k++)
        out->total += out->bytes[k];
    return 0;
}

int mem_plan_stage(const run_config *c, int p, mem_rank_plan *out, hearth_err *err)
{
    int tp = c->parallel.tp, cp = c->parallel.cp, dp = c->parallel.dp;
    if (p < 0 || p >= c->parallel.pp)
        return herr_set(err, HERR_CONFIG, "memory plan: stage %d is outside 0..%d", p,
                        c->parallel.pp - 1);
    memset(out, 0, sizeof *out);
    out->total = -1;
    for (int t = 0; t < tp; t++) {
        mem_rank_plan r;
        int rc = mem_plan_rank(c, t + tp * cp * dp * p, &r, err);
        if (rc)
            return rc;
        if (r.total > out->total)
            *out = r;
    }
    return 0;
}

int mem_plan_peak(const run_config *c, mem_rank_plan *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    out->total = -1;
    for (int p = 0; p < c->parallel.pp; p++) {
        mem_rank_plan r;
        int rc = mem_plan_stage(c, p, &r, err);
        if (rc)
            return rc;
        if (r.total > out->total)
            *out = r;
    }
    return 0;
}

int mem_plan_check_gpu_mem(const run_config *c, double gpu_mem_gib, hearth_err *err)
{
    if (c->device != DEVICE_CUDA || !(gpu_mem_gib > 0))
        return 0;
    mem_rank_plan peak;
    int rc = mem_plan_peak(c, &peak, err);
    if (rc)
        return rc;
    double need = (double)peak.total / (double)(1 << 30);
    if (need <= gpu_mem_gib)
        return 0;
    /* name the two largest categories: what to shrink */
    int k1 = 0, k2 = 1;
    for (int k = 0; k < MEM_CATEGORIES; k++)
        if (peak.bytes[k] > peak.bytes[k1])
            k1 = k;
    k2 = k1 == 0 ? 1 : 0;
    for (int k = 0; k < MEM_CATEGORIES; k++)
        if (k != k1 && peak.bytes[k] > peak.bytes[k2])
            k2 = k;
    return herr_set(err, HERR_CONFIG, "rule fits_gpu_mem: rank %d (pipeline stage %d, tp rank "
                    "%d) needs %.2f GiB, more than resources.gpu_mem %g GiB (largest: %s "
                    "%.2f GiB, %s %.2f GiB)", peak.rank, peak.p, peak.t, need, gpu_mem_gib,
                    mem_category_name((mem_category)k1),
                    (double)peak.bytes[k1] / (double)(1 << 30),
                    mem_category_name((mem_category)k2),
                    (double)peak.bytes[k2] / (double)(1 << 30));
}
