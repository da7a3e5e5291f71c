/* parallel_state.h - who a rank is in the layout, and its process groups, per component.
 *
 * DESIGN.md "Trainer internals": parallel state is an object per component, switched
 * explicitly at component boundaries (the trainer passes the encoder's object to encoder
 * code and the decoder's to decoder code; there is no hidden "current" state).  The
 * projector runs with the encoder (same tp: the rules require projector.hidden % encoder
 * tp == 0), so it uses the encoder's object.
 *
 * Rank order (DESIGN.md "Run config"): tp fastest, then cp, dp, pp:
 *     rank = t + tp * (c + cp * (d + dp * p))
 * with t < tp, c < cp, d < dp, p < pp.  ep is carved out of dp: e = d % ep (consecutive
 * dp indices form an ep group), q = d / ep.
 *
 * Decoder groups (every rank is in exactly one group of each kind; members are listed in
 * increasing world rank, which is the group rank order):
 *   TP     vary t                      size tp
 *   CP     vary c                      size cp
 *   DP     vary d                      size dp     (replicas of the same shard, cp = 1)
 *   PP     vary p                      size pp
 *   EP     vary e (same q)             size ep     (the all-to-all of MoE dispatch)
 *   EDP    vary c and q (same e)       size cp*dp/ep  (replicas of one expert shard:
 *                                                  where expert gradients are reduced)
 *   DP_CP  vary c and d                size cp*dp  (replicas of one dense shard: where
 *                                                  dense gradients are reduced)
 *   MP     vary t, c and p (same d)    size tp*cp*pp  (the model-parallel group)
 *
 * Encoder groups (also used by the projector).  The encoder has its own tensor-parallel
 * size etp (uniform: etp = tp; hetero_tp: etp < tp and divides it; hetero_dp and
 * full_separation: etp = 1).  Where it lives: on pipeline stage 0 (p == 0) for uniform,
 * hetero_tp and hetero_dp; on every rank for full_separation (every rank of the
 * model-parallel group encodes a share in phase 1).  Ranks without the encoder have no
 * encoder groups (size 0, present = 0).
 *   TP     the etp consecutive ranks of the decoder tp group that share t / etp:
 *          vary t % etp                size etp  (uniform: the decoder tp group;
 *                                                 hetero_dp/full_separation: the rank alone)
 *   DP     every rank holding a replica of the same encoder shard: same t % etp, any
 *          t / etp, c, d (and p for full_separation)
 *                                      size world / (etp * pp)  (full_separation:
 *                                                                world / etp = world)
 *          This is where encoder gradients are reduced ("reduced over every rank that holds
 *          a replica of an encoder shard", DESIGN.md).  Which of those replicas encode
 *          which images is the strategy's business: hetero_dp encodes a different
 *          microbatch on each rank of the decoder tp group (the owner index is the decoder
 *          tp rank and the broadcast group the decoder TP group); full_separation shares
 *          all microbatches over the decoder MP group (gather/scatter there).
 *   Other kinds have size 0 for the encoder (use the decoder's object for them).
 *
 * Ownership: parallel_state_create allocates the object and its comm handles;
 * parallel_state_free frees both.  Every rank must create its parallel states in the same
 * order (decoder then encoder, say), because comm_group_create pairs the k-th creation of
 * a member list on every member (see comm.h). */
#ifndef HEARTH_PARALLEL_STATE_H
#define HEARTH_PARALLEL_STATE_H

#include "comm/comm.h"
#include "shape/err.h"
#include "shape/run_config.h"

typedef enum { PS_DECODER = 0, PS_ENCODER = 1 } ps_component;

typedef enum {
    PS_TP = 0, PS_CP, PS_DP, PS_PP, PS_EP, PS_EDP, PS_DP_CP, PS_MP,
    PS_KINDS
} ps_group_kind;

typedef struct {
    int world, tp, cp, pp, dp, ep;
    encoder_strategy enc_strategy;
    int enc_tp;
} ps_layout;

typedef struct {
    int t, c, d, p;   /* decoder tp, cp, dp, pp indices */
    int e, q;         /* e = d % ep (ep rank), q = d / ep */
} ps_coords;

const char *ps_group_kind_name(ps_group_kind k);   /* "tp", "cp", ..., "dp_cp", "mp" */
const char *ps_component_name(ps_component c);     /* "decoder", "encoder" */

/* The layout of a resolved run config (ranks and the parallel.* sizes). */
void ps_layout_from_config(const run_config *c, ps_layout *out);

/* The rules this module relies on: sizes >= 1, world = tp*cp*dp*pp, ep divides dp, and
 * the encoder tp of the strategy (see above).  HERR_CONFIG with a message otherwise. */
int ps_layout_check(const ps_layout *l, hearth_err *err);

/* Rank <-> coordinates (l checked; rank in range). */
void ps_coords_of(const ps_layout *l, int rank, ps_coords *out);
int ps_rank_of(const ps_layout *l, int t, int c, int d, int p);

/* Whether the component has parameters on `rank` (the decoder: always). */
int ps_present(const ps_layout *l, ps_component comp, int rank);

/* Pure index math: writes the world ranks of `rank`'s group of `kind` for `comp` into
 * members (room for l->world entries), in group order, sets *index to rank's position,
 * and returns the group size; 0 when rank has no such group (then *index = -1).
 * l must pass ps_layout_check. */
int ps_group_members(const ps_layout *l, ps_component comp, ps_group_kind kind, int rank,
                     int *members, int *index);

typedef struct {
    ps_component component;
    ps_layout layout;
    int rank;                   /* world rank */
    ps_coords coords;
    int present;                /* the component has parameters on this rank */
    int size[PS_KINDS];         /* group sizes (0: none) */
    int index[PS_KINDS];        /* this rank's position in each group (-1: none) */
    comm *group[PS_KINDS];      /* the groups (NULL where size 0); owned */
} parallel_state;

/* Creates rank comm_rank(world)'s state for comp: checks l, computes the groups and
 * creates their communicators from `world` (this rank's handle on the whole world, whose
 * size must be l->world).  Called from the rank's own thread; does not wait for others. */
int parallel_state_create(parallel_state **out, const ps_layout *l, ps_component comp,
                          comm *world, hearth_err *err);
void parallel_state_free(parallel_state *ps);

#endif
