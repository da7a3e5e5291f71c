/* ranks.h - multi-rank code run as threads on the `local` communicator, for the unit
 * tests: one thread per rank, each with its own handle on a fresh world of n ranks.
 *
 * Rank threads must not call cmocka (its failure path is not thread-safe): the rank
 * function returns a herr code with its message in its own hearth_err, and the main
 * thread checks them after every thread has finished.  No cmocka dependency here either
 * (the bench links the support files too). */
#ifndef HEARTH_RANKS_H
#define HEARTH_RANKS_H

#include "comm/comm.h"
#include "shape/err.h"

#define RANKS_MAX 16

/* One rank's work: `world` is this rank's handle on the whole world (group rank == world
 * rank), freed by ranks_run after fn returns.  0, or a negative herr code with err set. */
typedef int (*ranks_fn)(void *ctx, int rank, comm *world, hearth_err *err);

/* Runs fn(ctx, r, world, &errs[r]) for r in [0, n) on n threads of a new local world
 * (timeout_ms per operation; 0 waits forever) and frees the world when all are done.
 * rc[r] gets rank r's result (also a failure to get its handle); rc and errs hold n
 * entries.  Returns 0 when every rank ran (whatever their results), else a negative herr
 * code with *err set (bad n, no world, a thread that could not start: the world is then
 * aborted so that the started ranks return). */
int ranks_run(int n, int timeout_ms, ranks_fn fn, void *ctx, int *rc, hearth_err *errs,
              hearth_err *err);

/* ---- a tp x ep x pp grid of ranks --------------------------------------------------
 * rank = (s * ep + e) * tp + t, tp fastest: t is the tensor-parallel rank, e the data
 * (expert-parallel) rank and s the pipeline stage. */
typedef struct {
    int tp, ep;
    int t, e, s;
    int tp_ranks[RANKS_MAX];   /* world ranks of this rank's tp group: same s and e */
    int ep_ranks[RANKS_MAX];   /* world ranks of its ep group: same s and t */
} ranks_grid;

/* Fills *g for `rank` of a grid with tp and ep ranks per stage (tp, ep <= RANKS_MAX). */
void ranks_grid_place(ranks_grid *g, int rank, int tp, int ep);
/* Creates this rank's tp and ep groups on `world` (every rank of them must call it); a
 * group of one rank is not created (NULL).  The caller frees both with comm_free.  0, or
 * a negative herr code with err set and both NULL. */
int ranks_grid_groups(const ranks_grid *g, comm *world, comm **tpc, comm **epc,
                      hearth_err *err);

#endif
