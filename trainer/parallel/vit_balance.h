/* vit_balance.h - which rank encodes which image, balanced by estimated encoder cost.
 *
 * Before encoding, the images of a step are reassigned across the ranks that encode them
 * (DESIGN.md "ViT DP balance"); the encoder outputs then go back to the rank that owns
 * each image.  This module only decides the assignment; the trainer moves the data.
 *
 * cost(i) = patches[i]^2 + linear_coef * patches[i]  (attention is quadratic in the
 * patches, the MLPs and projections linear).  load(r) = sum of the costs assigned to r;
 * imbalance = max load / mean load - 1 (0 when there is no load at all).
 *
 * The rule:
 *   - n_ranks == 1, or the owners' imbalance < VIT_BALANCE_SKIP (0.2): assign = owner,
 *     skipped = 1 (moving images costs communication; a small imbalance is not worth it).
 *   - else greedy longest-first: images by cost descending (ties by index), each to the
 *     least-loaded rank (ties by lowest rank); then up to max_rounds refinement passes
 *     between the most and the least loaded rank (ties by lowest rank): the single move
 *     or the pairwise swap that brings the pair's larger load lowest (ties: the smaller
 *     load moved, a move before a swap, the costlier image), if that is below the most
 *     loaded rank's load; a pass that finds none ends the refinement.
 *     The same refinement is also run from the owners' assignment, and the result is the
 *     one of the two with the lower max load (ties: fewer images moved, then the greedy
 *     one); when neither beats the owners' max load, assign = owner.  So the result's max
 *     load is never above the owners' nor above the greedy one (max_rounds = 0 gives
 *     greedy alone against the owners).
 * Deterministic: the same input gives the same output.
 *
 * Scratch memory is allocated per call (O(n_images + n_ranks)) and freed before return;
 * no global state, no communication. */
#ifndef HEARTH_VIT_BALANCE_H
#define HEARTH_VIT_BALANCE_H

#include <stdint.h>

#include "shape/err.h"

#define VIT_BALANCE_SKIP 0.2

typedef struct {
    double before, after;   /* imbalance of the owners' assignment and of the result */
    int moved;              /* images with assign[i] != owner[i] */
    int skipped;            /* 1 when assign = owner without balancing */
} vit_balance_stats;

/* The cost of one image. */
double vit_balance_cost(int64_t patches, double linear_coef);

/* Writes assign[i] (0 .. n_ranks - 1) for each of n_images images; see above.  patches
 * and owner are n_images long (may be NULL when n_images == 0); stats may be NULL.
 * Returns 0, or HERR_RUNTIME for bad arguments (n_ranks < 1, an owner out of range,
 * negative patches, a negative or non-finite linear_coef, max_rounds < 0), HERR_NOMEM. */
int vit_balance_assign(const int64_t *patches, const int *owner, int n_images, int n_ranks,
                       double linear_coef, int max_rounds, int *assign, vit_balance_stats *stats,
                       hearth_err *err);

#endif
