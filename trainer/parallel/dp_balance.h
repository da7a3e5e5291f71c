/* dp_balance.h - which DP rank trains which micro batch of a step, balanced by estimated
 * cost (data.balance; docs/parallel/dp_balance.md).
 *
 * Micro batches move whole, so each one (and its MoE balancing loss) is exactly the one
 * of the unbalanced run: only the order in which the DP ranks' gradients are summed
 * changes.  Every rank takes the same number, per_rank = n / n_ranks (pipelines and the
 * encoder strategies expect it).
 *
 * The rule: greedy longest-first (micro batches by cost descending, ties by lower index;
 * each to the least-loaded rank that has room, ties by lower rank), then up to
 * max_rounds refinement passes: the swap of a micro batch of the most loaded rank (ties:
 * lowest rank) with one of another rank that brings the larger of the two loads lowest
 * (ties: the first pair in index order), when that is below the most loaded rank's load;
 * a pass that finds none ends it.  The result is used only when its max load is below the plain
 * assignment's (rank d: micro batches [d per_rank, (d+1) per_rank)); otherwise the plain
 * one stays.  Deterministic.
 *
 * Scratch memory is allocated per call and freed before return; no communication. */
#ifndef HEARTH_DP_BALANCE_H
#define HEARTH_DP_BALANCE_H

#include "shape/err.h"

#define DP_BALANCE_ROUNDS 64

typedef struct {
    double before, after;   /* max load / mean load - 1 of the plain and the result */
    int moved;              /* micro batches not on their plain rank */
} dp_balance_stats;

/* rank_of[m] (0 .. n_ranks - 1) for each of n micro batches of cost[m] >= 0; n must be a
 * multiple of n_ranks.  stats may be NULL.  HERR_RUNTIME for bad arguments, HERR_NOMEM. */
int dp_balance_assign(const double *cost, int n, int n_ranks, int max_rounds, int *rank_of,
                      dp_balance_stats *stats, hearth_err *err);

#endif
