/* parallel_state.c - rank coordinates and process groups from the layout (see the
 * header for the exact definitions). */
#include "parallel/parallel_state.h"

#include <stdlib.h>

const char *ps_group_kind_name(ps_group_kind k)
{
    static const char *const names[PS_KINDS] = { "tp", "cp", "dp", "pp", "ep", "edp",
                                                 "dp_cp", "mp" };
    return (unsigned)k < PS_KINDS ? names[k] : "?";
}

const char *ps_component_name(ps_component c)
{
    return c == PS_DECODER ? "decoder" : c == PS_ENCODER ? "encoder" : "?";
}

void ps_layout_from_config(const run_config *c, ps_layout *out)
{
    out->world = c->ranks;
    out->tp = c->parallel.tp;
    out->cp = c->parallel.cp;
    out->pp = c->parallel.pp;
    out->dp = c->parallel.dp;
    out->ep = c->parallel.ep;
    out->enc_strategy = c->parallel.encoder.strategy;
    out->enc_tp = c->parallel.encoder.tp;
}

int ps_layout_check(const ps_layout *l, hearth_err *err)
{
    if (l->world < 1 || l->tp < 1 || l->cp < 1 || l->pp < 1 || l->dp < 1 || l->ep < 1 ||
        l->enc_tp < 1)
        return herr_set(err, HERR_CONFIG, "parallel layout: every size must be >= 1");
    if ((long)l->tp * l->cp * l->pp * l->dp != l->world)
        return herr_set(err, HERR_CONFIG,
                        "parallel layout: world %d != tp %d x cp %d x dp %d x pp %d", l->world,
                        l->tp, l->cp, l->dp, l->pp);
    if (l->dp % l->ep)
        return herr_set(err, HERR_CONFIG, "parallel layout: ep %d must divide dp %d", l->ep,
                        l->dp);
    switch (l->enc_strategy) {
    case ENC_UNIFORM:
        if (l->enc_tp != l->tp)
            return herr_set(err, HERR_CONFIG,
                            "parallel layout: uniform needs encoder tp %d == tp %d", l->enc_tp,
                            l->tp);
        break;
    case ENC_HETERO_TP:
        if (!(l->enc_tp < l->tp && l->tp % l->enc_tp == 0))
            return herr_set(err, HERR_CONFIG,
                            "parallel layout: hetero_tp needs encoder tp %d < tp %d dividing it",
                            l->enc_tp, l->tp);
        break;
    case ENC_HETERO_DP:
    case ENC_FULL_SEPARATION:
        if (l->enc_tp != 1)
            return herr_set(err, HERR_CONFIG, "parallel layout: %s needs encoder tp 1, got %d",
                            encoder_strategy_name(l->enc_strategy), l->enc_tp);
        break;
    default:
        return herr_set(err, HERR_CONFIG, "parallel layout: unknown encoder strategy %d",
                        (int)l->enc_strategy);
    }
    return 0;
}

void ps_coords_of(const ps_layout *l, int rank, ps_coords *out)
{
    out->t = rank % l->tp;
    rank /= l->tp;
    out->c = rank % l->cp;
    rank /= l->cp;
    out->d = rank % l->dp;
    out->p = rank / l->dp;
    out->e = out->d % l->ep;
    out->q = out->d / l->ep;
}

int ps_rank_of(const ps_layout *l, int t, int c, int d, int p)
{
    return t + l->tp * (c + l->cp * (d + l->dp * p));
}

int ps_present(const ps_layout *l, ps_component comp, int rank)
{
    if (comp == PS_DECODER)
        return 1;
    if (l->enc_strategy == ENC_FULL_SEPARATION)
        return 1;
    ps_coords k;
    ps_coords_of(l, rank, &k);
    return k.p == 0;
}

/* Does `other` belong to `rank`'s group of this kind?  Each kind is "same values of the
 * coordinates that are fixed"; members are then every rank in increasing order, which is
 * the group order because the varying coordinates are listed fastest-first in rank order
 * (e.g. EDP varies c and q = d / ep: c is faster than d). */
static int same_group(const ps_layout *l, ps_component comp, ps_group_kind kind,
                      const ps_coords *a, const ps_coords *b)
{
    if (comp == PS_DECODER) {
        switch (kind) {
        case PS_TP: return a->c == b->c && a->d == b->d && a->p == b->p;
        case PS_CP: return a->t == b->t && a->d == b->d && a->p == b->p;
        case PS_DP: return a->t == b->t && a->c == b->c && a->p == b->p;
        case PS_PP: return a->t == b->t && a->c == b->c && a->d == b->d;
        case PS_EP: return a->t == b->t && a->c == b->c && a->p == b->p && a->q == b->q;
        case PS_EDP: return a->t == b->t && a->p == b->p && a->e == b->e;
        case PS_DP_CP: return a->t == b->t && a->p == b->p;
        case PS_MP: return a->d == b->d;
        default: return 0;
        }
    }
    int etp = l->enc_tp;
    switch (kind) {
    case PS_TP:
        return a->t / etp == b->t / etp && a->c == b->c && a->d == b->d && a->p == b->p;
    case PS_DP:
        return a->t % etp == b->t % etp &&
               (l->enc_strategy == ENC_FULL_SEPARATION || a->p == b->p);
    default:
        return 0;
    }
}

int ps_group_members(const ps_layout *l, ps_component comp, ps_group_kind kind, int rank,
                     int *members, int *index)
{
    *index = -1;
    if (!ps_present(l, comp, rank))
        return 0;
    ps_coords me;
    ps_coords_of(l, rank, &me);
    int n = 0;
    for (int r = 0; r < l->world; r++) {
        if (!ps_present(l, comp, r))
            continue;
        ps_coords o;
        ps_coords_of(l, r, &o);
        if (!same_group(l, comp, kind, &me, &o))
            continue;
        if (r == rank)
            *index = n;
        members[n++] = r;
    }
    if (*index < 0)      /* a kind the component has no group of */
        return 0;
    return n;
}

int parallel_state_create(parallel_state **out, const ps_layout *l, ps_component comp,
                          comm *world, hearth_err *err)
{
    *out = NULL;
    int rc = ps_layout_check(l, err);
    if (rc)
        return rc;
    if (comm_size(world) != l->world)
        return herr_set(err, HERR_CONFIG,
                        "parallel state: the world communicator has %d ranks, the layout %d",
                        comm_size(world), l->world);
    parallel_state *ps = calloc(1, sizeof *ps);
    int *members = malloc((size_t)l->world * sizeof *members);
    if (!ps || !members) {
        free(ps);
        free(members);
        return herr_set(err, HERR_NOMEM, "parallel state: out of memory");
    }
    ps->component = comp;
    ps->layout = *l;
    ps->rank = comm_world_rank_of(world, comm_rank(world));
    ps_coords_of(l, ps->rank, &ps->coords);
    ps->present = ps_present(l, comp, ps->rank);
    for (int k = 0; k < PS_KINDS; k++) {
        ps->size[k] = ps_group_members(l, comp, (ps_group_kind)k, ps->rank, members,
                                       &ps->index[k]);
        if (!ps->size[k])
            continue;
        rc = comm_group_create(world, members, ps->size[k], &ps->group[k], err);
        if (rc) {
            herr_prefix(err, rc, "parallel state: %s %s group", ps_component_name(comp),
                        ps_group_kind_name((ps_group_kind)k));
            free(members);
            parallel_state_free(ps);
            return rc;
        }
    }
    free(members);
    *out = ps;
    return 0;
}

void parallel_state_free(parallel_state *ps)
{
    if (!ps)
        return;
    for (int k = 0; k < PS_KINDS; k++)
        comm_free(ps->group[k]);
    free(ps);
}
