/* param_sync.c - creating the gradient/parameter synchroniser (param_sync.h): which
 * tensor is reduced where, the extra groups, the flat buckets and the AdamW state. */
#include "parallel/param_sync_internal.h"

#include <stdlib.h>
#include <string.h>

#include "model/model_shard.h"
#include "train.h"

static int component_of(const char *name)
{
    if (!strncmp(name, "encoder.", 8) || !strncmp(name, "projector.", 10))
        return PS_ENCODER;
    if (!strncmp(name, "decoder.", 8))
        return PS_DECODER;
    return -1;
}

static int group_index(const parallel_state *ps, ps_group_kind k)
{
    return ps->size[k] > 0 && ps->index[k] >= 0 ? ps->index[k] : 0;
}

static int group_size(const parallel_state *ps, ps_group_kind k)
{
    return ps->size[k] > 0 ? ps->size[k] : 1;
}

/* The replica group (step 4) of a tensor. */
static int rep_kind(int comp, const model_tensor *t)
{
    if (comp == PS_ENCODER)
        return PS_REP_ENC;
    return t->shard.expert ? PS_REP_EXPERT : PS_REP_DENSE;
}

/* Leading local elements that this rank counts once in the full model (before the
 * replica rule): none for a tied copy or a tp-replicated tensor off tp rank 0 (a
 * tp-partial tensor is one too once step 1 has summed it), only the q rows of a
 * kv-replicated qkv tensor off the first rank of its kv group. */
static size_t norm_count(const model_tensor *t, int tp_index)
{
    const model_shard *sh = &t->shard;
    if (sh->tied_copy || ((sh->tp_replicated || sh->tp_partial) && tp_index != 0))
        return 0;
    if (sh->kv_rep > 1 && tp_index % sh->kv_rep != 0)
        return (size_t)(sh->seg_rows[0] * sh->ncols);
    return t->numel;
}

static int sum_add(ps_sum *s, float *p, size_t len)
{
    float **np = realloc(s->ptr, (size_t)(s->n + 1) * sizeof *np);
    if (!np)
        return -1;
    s->ptr = np;
    size_t *nl = realloc(s->len, (size_t)(s->n + 1) * sizeof *nl);
    if (!nl)
        return -1;
    s->len = nl;
    s->ptr[s->n] = p;
    s->len[s->n] = len;
    s->n++;
    s->total += len;
    return 0;
}

/* The first stage's embedding that pairs with the last stage's tied copy. */
static int is_tied_first(const param_sync *s, const model *m, const ps_tensor *pt)
{
    const model_shape *sh = model_get_shape(m);
    return pt->comp == PS_DECODER && !pt->t.shard.tied_copy && sh->decoder.tied_embeddings &&
           s->dec->layout.pp > 1 && s->dec->coords.p == 0 &&
           !strcmp(pt->t.name, "decoder.embed.weight");
}

/* Describes every tensor; fills the sum lists (groups not yet made). */
static int describe_tensors(param_sync *s, model *const *models, int n_models,
                            hearth_err *err)
{
    int n = 0;
    for (int i = 0; i < n_models; i++)
        n += model_tensor_count(models[i]);
    s->tensors = calloc(n ? (size_t)n : 1, sizeof *s->tensors);
    if (!s->tensors)
        return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
    int kv[2] = { 0, 0 };
    for (int i = 0; i < n_models; i++) {
        model *m = models[i];
        for (int j = 0; j < model_tensor_count(m); j++) {
            ps_tensor *pt = &s->tensors[s->n_tensors++];
            pt->t = *model_tensor_at(m, j);
            const model_shard *sh = &pt->t.shard;
            pt->p = model_params(m) + pt->t.offset;
            pt->g = model_grads(m) + pt->t.offset;
            pt->comp = component_of(pt->t.name);
            if (pt->comp < 0)
                return herr_set(err, HERR_RUNTIME, "param_sync: tensor %s belongs to no "
                                "component", pt->t.name);
            const parallel_state *ps = pt->comp == PS_ENCODER ? s->enc : s->dec;
            if (!ps->present)
                return herr_set(err, HERR_RUNTIME, "param_sync: rank %d holds %s but has "
                                "no %s parallel state", s->dec->rank, pt->t.name,
                                ps_component_name((ps_component)pt->comp));
            if (model_shard_numel(sh) != pt->t.numel)
                return herr_set(err, HERR_RUNTIME, "param_sync: %s has %zu elements, its "
                                "shard %zu", pt->t.name, pt->t.numel, model_shard_numel(sh));
            pt->tp_index = group_index(ps, PS_TP);
            pt->norm_n = norm_count(&pt->t, pt->tp_index);
            pt->bucket = -1;
            if (sh->kv_rep > 1 && sh->nseg != 3)
                return herr_set(err, HERR_RUNTIME, "param_sync: %s: kv_rep %d needs 3 row "
                                "segments, has %d", pt->t.name, sh->kv_rep, sh->nseg);
            if (sh->tied_copy && (pt->comp != PS_DECODER || s->dec->layout.pp < 2))
                return herr_set(err, HERR_RUNTIME, "param_sync: %s: a tied copy needs a "
                                "decoder with pp > 1", pt->t.name);
            int rk = rep_kind(pt->comp, &pt->t);
            const parallel_state *rps = rk == PS_REP_ENC ? s->enc : s->dec;
            ps_group_kind gk = rk == PS_REP_ENC ? PS_DP : rk == PS_REP_EXPERT ? PS_EDP : PS_DP_CP;
            pt->replica_index = group_index(rps, gk);
            if (pt->t.frozen)
                continue;
            int enc = pt->comp == PS_ENCODER;
            if (sh->tp_partial && group_size(ps, PS_TP) > 1 &&
                sum_add(&s->sum[enc ? PS_SUM_TP_ENC : PS_SUM_TP_DEC], pt->g, pt->t.numel))
                return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
            if (sh->kv_rep > 1) {
                if (kv[enc] && kv[enc] != sh->kv_rep)
                    return herr_set(err, HERR_RUNTIME, "param_sync: %s: kv_rep %d differs "
                                    "from another tensor's %d", pt->t.name, sh->kv_rep,
                                    kv[enc]);
                kv[enc] = sh->kv_rep;
                size_t q = (size_t)(sh->seg_rows[0] * sh->ncols);
                if (sum_add(&s->sum[enc ? PS_SUM_KV_ENC : PS_SUM_KV_DEC], pt->g + q,
                            pt->t.numel - q))
                    return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
            }
            if ((sh->tied_copy || is_tied_first(s, m, pt)) &&
                sum_add(&s->sum[PS_SUM_TIED], pt->g, pt->t.numel))
                return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
        }
    }
    /* Sums over existing groups borrow them. */
    if (s->sum[PS_SUM_TP_ENC].n)
        s->sum[PS_SUM_TP_ENC].c = s->enc->group[PS_TP];
    if (s->sum[PS_SUM_TP_DEC].n)
        s->sum[PS_SUM_TP_DEC].c = s->dec->group[PS_TP];
    s->sum[PS_SUM_KV_ENC].kv_rep = kv[1];
    s->sum[PS_SUM_KV_DEC].kv_rep = kv[0];
    return 0;
}

/* Creates the kv-replica group (kv_rep consecutive ranks of the TP group) and the
 * tied-embedding group (first and last pipeline stage), in this fixed order on every
 * rank: a rank creates a group exactly when it has tensors reduced there, which every
 * member of that group has too (they hold the same tensors), so the k-th creation of a
 * member list pairs up (comm.h). */
static int make_groups(param_sync *s, hearth_err *err)
{
    int members[2];
    for (int k = PS_SUM_KV_ENC; k <= PS_SUM_KV_DEC; k++) {
        ps_sum *sum = &s->sum[k];
        int kv = sum->kv_rep;
        if (!sum->n)
            continue;
        const parallel_state *ps = k == PS_SUM_KV_ENC ? s->enc : s->dec;
        comm *tp = ps->group[PS_TP];
        int n = tp ? comm_size(tp) : 1, me = tp ? comm_rank(tp) : 0;
        if (n % kv)
            return herr_set(err, HERR_RUNTIME, "param_sync: kv_rep %d does not divide the "
                            "%s tp size %d", kv, ps_component_name((ps_component)ps->component),
                            n);
        int *list = malloc((size_t)kv * sizeof *list);
        if (!list)
            return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
        for (int i = 0; i < kv; i++)
            list[i] = comm_world_rank_of(tp, me / kv * kv + i);
        int rc = comm_group_create(s->world, list, kv, &sum->c, err);
        free(list);
        if (rc)
            return herr_prefix(err, rc, "param_sync: kv group");
        sum->owned = 1;
    }
    ps_sum *tied = &s->sum[PS_SUM_TIED];
    if (tied->n) {
        comm *pp = s->dec->group[PS_PP];
        if (!pp || comm_size(pp) < 2 || tied->n != 1)
            return herr_set(err, HERR_RUNTIME, "param_sync: %d tied embedding tensors on a "
                            "rank of a pipeline of %d stages", tied->n, pp ? comm_size(pp) : 1);
        members[0] = comm_world_rank_of(pp, 0);
        members[1] = comm_world_rank_of(pp, comm_size(pp) - 1);
        int rc = comm_group_create(s->world, members, 2, &tied->c, err);
        if (rc)
            return herr_prefix(err, rc, "param_sync: tied embedding group");
        tied->owned = 1;
    }
    for (int k = 0; k < PS_SUM_KINDS; k++) {
        ps_sum *sum = &s->sum[k];
        if (sum->n && !(sum->buf = malloc(sum->total ? sum->total * sizeof(float) : 1)))
            return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
    }
    return 0;
}

/* Flattens the trainable tensors into their replica buckets and sizes the parts. */
static int make_buckets(param_sync *s, hearth_err *err)
{
    static const ps_group_kind gk[PS_REP_KINDS] = { PS_DP, PS_EDP, PS_DP_CP };
    for (int k = 0; k < PS_REP_KINDS; k++) {
        ps_bucket *b = &s->rep[k];
        const parallel_state *ps = k == PS_REP_ENC ? s->enc : s->dec;
        b->c = ps->present && ps->size[gk[k]] > 1 ? ps->group[gk[k]] : NULL;
        b->size = b->c ? comm_size(b->c) : 1;
        b->rank = b->c ? comm_rank(b->c) : 0;
    }
    for (int i = 0; i < s->n_tensors; i++) {
        ps_tensor *pt = &s->tensors[i];
        if (pt->t.frozen)
            continue;
        ps_bucket *b = &s->rep[rep_kind(pt->comp, &pt->t)];
        int *nt = realloc(b->ti, (size_t)(b->n + 1) * sizeof *nt);
        if (!nt)
            return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
        b->ti = nt;
        b->ti[b->n++] = i;
        pt->bucket = (int)(b - s->rep);
        pt->flat = b->total;
        b->total += pt->t.numel;
    }
    for (int k = 0; k < PS_REP_KINDS; k++) {
        ps_bucket *b = &s->rep[k];
        size_t n = (size_t)b->size;
        if (s->opts.distributed_optimizer) {
            b->chunk = (b->total + n - 1) / n;
            b->lo = b->rank * b->chunk < b->total ? b->rank * b->chunk : b->total;
            b->hi = b->lo + b->chunk < b->total ? b->lo + b->chunk : b->total;
        } else {
            b->chunk = b->total;
            n = 1;
            b->lo = 0;
            b->hi = b->total;
        }
        size_t flat = n * b->chunk, own = b->hi - b->lo;
        b->g = calloc(flat ? flat : 1, sizeof(float));
        b->p = calloc(flat ? flat : 1, sizeof(float));
        b->m = calloc(own ? own : 1, sizeof(float));
        b->v = calloc(own ? own : 1, sizeof(float));
        if (!b->g || !b->p || !b->m || !b->v)
            return herr_set(err, HERR_NOMEM, "param_sync: out of memory for %zu optimizer "
                            "elements", flat);
    }
    return 0;
}

int param_sync_create(param_sync **out, model *const *models, int n_models,
                      const parallel_state *dec, const parallel_state *enc, comm *world,
                      const param_sync_opts *opts, hearth_err *err)
{
    *out = NULL;
    if (n_models < 1 || !dec || !enc || !world)
        return herr_set(err, HERR_RUNTIME, "param_sync: needs at least one model, both "
                        "parallel states and the world");
    if (comm_size(world) != dec->layout.world)
        return herr_set(err, HERR_RUNTIME, "param_sync: the world has %d ranks, the layout %d",
                        comm_size(world), dec->layout.world);
    param_sync *s = calloc(1, sizeof *s);
    if (!s)
        return herr_set(err, HERR_NOMEM, "param_sync: out of memory");
    if (opts) {
        s->opts = *opts;
    } else {
        s->opts.beta1 = TRAIN_ADAM_BETA1;
        s->opts.beta2 = TRAIN_ADAM_BETA2;
        s->opts.eps = TRAIN_ADAM_EPS;
    }
    s->world = world;
    s->dec = dec;
    s->enc = enc;
    int rc = describe_tensors(s, models, n_models, err);
    if (!rc)
        rc = make_groups(s, err);
    if (!rc)
        rc = make_buckets(s, err);
    if (rc) {
        param_sync_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void param_sync_free(param_sync *s)
{
    if (!s)
        return;
    for (int k = 0; k < PS_SUM_KINDS; k++) {
        ps_sum *sum = &s->sum[k];
        if (sum->owned)
            comm_free(sum->c);
        free(sum->ptr);
        free(sum->len);
        free(sum->buf);
    }
    for (int k = 0; k < PS_REP_KINDS; k++) {
        ps_bucket *b = &s->rep[k];
        free(b->ti);
        free(b->g);
        free(b->p);
        free(b->m);
        free(b->v);
    }
    free(s->tensors);
    free(s);
}
