/* ranks.c - multi-rank code as threads on the local communicator (see ranks.h). */
#include "ranks.h"

#include <pthread.h>
#include <string.h>

typedef struct {
    comm_world *w;
    ranks_fn fn;
    void *ctx;
    int rank;
    int *rc;
    hearth_err *err;
} rank_job;

static void *rank_thread(void *p)
{
    rank_job *j = p;
    comm *world = NULL;
    *j->rc = comm_local_world_rank(j->w, j->rank, &world, j->err);
    if (!*j->rc)
        *j->rc = j->fn(j->ctx, j->rank, world, j->err);
    comm_free(world);
    return NULL;
}

int ranks_run(int n, int timeout_ms, ranks_fn fn, void *ctx, int *rc, hearth_err *errs,
              hearth_err *err)
{
    if (n < 1 || n > RANKS_MAX)
        return herr_set(err, HERR_RUNTIME, "ranks_run: %d ranks (1 to %d)", n, RANKS_MAX);
    comm_world *w = NULL;
    comm_local_opts o = { .timeout_ms = timeout_ms };
    int ret = comm_local_world_create(&w, n, &o, err);
    if (ret)
        return ret;
    pthread_t th[RANKS_MAX];
    rank_job jobs[RANKS_MAX];
    int started = 0;
    for (; started < n; started++) {
        jobs[started] = (rank_job){ w, fn, ctx, started, &rc[started], &errs[started] };
        if (pthread_create(&th[started], NULL, rank_thread, &jobs[started])) {
            ret = herr_set(err, HERR_RUNTIME, "ranks_run: thread for rank %d", started);
            comm_local_world_abort(w);
            break;
        }
    }
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    comm_local_world_free(w);
    return ret;
}

void ranks_grid_place(ranks_grid *g, int rank, int tp, int ep)
{
    memset(g, 0, sizeof *g);
    g->tp = tp;
    g->ep = ep;
    g->t = rank % tp;
    g->e = rank / tp % ep;
    g->s = rank / tp / ep;
    for (int i = 0; i < tp; i++)
        g->tp_ranks[i] = (g->s * ep + g->e) * tp + i;
    for (int i = 0; i < ep; i++)
        g->ep_ranks[i] = (g->s * ep + i) * tp + g->t;
}

int ranks_grid_groups(const ranks_grid *g, comm *world, comm **tpc, comm **epc,
                      hearth_err *err)
{
    *tpc = *epc = NULL;
    int rc = 0;
    if (g->tp > 1 && (rc = comm_group_create(world, g->tp_ranks, g->tp, tpc, err)))
        return rc;
    if (g->ep > 1 && (rc = comm_group_create(world, g->ep_ranks, g->ep, epc, err))) {
        comm_free(*tpc);
        *tpc = NULL;
    }
    return rc;
}
