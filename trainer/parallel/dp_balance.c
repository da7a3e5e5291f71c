#include "parallel/dp_balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const double *cost;
    int *rank_of;
    double *load;
    int n, n_ranks;
} dp_state;

typedef struct {
    double cost;
    int index;
} dp_item;

static void loads(dp_state *s)
{
    memset(s->load, 0, (size_t)s->n_ranks * sizeof(double));
    for (int m = 0; m < s->n; m++)
        s->load[s->rank_of[m]] += s->cost[m];
}

static int max_rank(const dp_state *s)
{
    int a = 0;
    for (int r = 1; r < s->n_ranks; r++)
        if (s->load[r] > s->load[a])
            a = r;
    return a;
}

static double imbalance(const dp_state *s)
{
    double sum = 0;
    for (int r = 0; r < s->n_ranks; r++)
        sum += s->load[r];
    return sum > 0 ? s->load[max_rank(s)] / (sum / s->n_ranks) - 1.0 : 0.0;
}

/* Cost descending, ties by index. */
static int by_cost_desc(const void *x, const void *y)
{
    const dp_item *a = x, *b = y;
    if (a->cost != b->cost)
        return a->cost > b->cost ? -1 : 1;
    return a->index - b->index;
}

static void greedy(dp_state *s, dp_item *items, int *count, int per_rank)
{
    for (int m = 0; m < s->n; m++)
        items[m] = (dp_item){ s->cost[m], m };
    qsort(items, (size_t)s->n, sizeof *items, by_cost_desc);
    memset(s->load, 0, (size_t)s->n_ranks * sizeof(double));
    memset(count, 0, (size_t)s->n_ranks * sizeof(int));
    for (int k = 0; k < s->n; k++) {
        int best = -1;
        for (int r = 0; r < s->n_ranks; r++)
            if (count[r] < per_rank && (best < 0 || s->load[r] < s->load[best]))
                best = r;
        s->rank_of[items[k].index] = best;
        s->load[best] += items[k].cost;
        count[best]++;
    }
}

/* One refinement pass (see the header); 1 when it swapped. */
static int refine_once(dp_state *s)
{
    int a = max_rank(s), bi = -1, bj = -1;
    double best = s->load[a];
    for (int i = 0; i < s->n; i++) {
        if (s->rank_of[i] != a)
            continue;
        for (int j = 0; j < s->n; j++) {
            int b = s->rank_of[j];
            if (b == a)
                continue;
            double d = s->cost[i] - s->cost[j];
            double la = s->load[a] - d, lb = s->load[b] + d;
            double worst = la > lb ? la : lb;
            if (worst < best) {
                best = worst;
                bi = i;
                bj = j;
            }
        }
    }
    if (bi < 0)
        return 0;
    s->rank_of[bi] = s->rank_of[bj];
    s->rank_of[bj] = a;
    loads(s);
    return 1;
}

int dp_balance_assign(const double *cost, int n, int n_ranks, int max_rounds, int *rank_of,
                      dp_balance_stats *stats, hearth_err *err)
{
    if (n_ranks < 1 || n < 0 || n % n_ranks || max_rounds < 0)
        return herr_set(err, HERR_RUNTIME, "dp_balance: %d micro batches cannot be shared "
                        "evenly by %d ranks", n, n_ranks);
    for (int m = 0; m < n; m++)
        if (!(cost[m] >= 0) || isinf(cost[m]))
            return herr_set(err, HERR_RUNTIME, "dp_balance: micro batch %d has cost %g", m,
                            cost[m]);
    int per_rank = n_ranks ? n / n_ranks : 0;
    double *load = calloc((size_t)n_ranks, sizeof *load);
    int *count = calloc((size_t)n_ranks, sizeof *count);
    int *plain = malloc((size_t)(n ? n : 1) * sizeof *plain);
    dp_item *items = malloc((size_t)(n ? n : 1) * sizeof *items);
    if (!load || !count || !plain || !items) {
        free(load);
        free(count);
        free(plain);
        free(items);
        return herr_set(err, HERR_NOMEM, "dp_balance: out of memory");
    }
    dp_state s = { cost, plain, load, n, n_ranks };
    for (int m = 0; m < n; m++)
        plain[m] = m / per_rank;
    loads(&s);
    double plain_max = n ? load[max_rank(&s)] : 0, before = imbalance(&s);

    s.rank_of = rank_of;
    greedy(&s, items, count, per_rank);
    for (int r = 0; r < max_rounds && refine_once(&s); r++)
        ;
    if (!(n && load[max_rank(&s)] < plain_max)) {
        memcpy(rank_of, plain, (size_t)n * sizeof *rank_of);
        loads(&s);
    }
    if (stats) {
        stats->before = before;
        stats->after = imbalance(&s);
        stats->moved = 0;
        for (int m = 0; m < n; m++)
            stats->moved += rank_of[m] != plain[m];
    }
    free(load);
    free(count);
    free(plain);
    free(items);
    return 0;
}
