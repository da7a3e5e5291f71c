/* vit_balance.c - greedy longest-first assignment of images to encoding ranks, with a
 * bounded move/swap refinement.  See vit_balance.h for the rule. */
#include "parallel/vit_balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A refinement step must lower the pair's larger load by more than this fraction of it:
 * loads are updated incrementally in double, and a step that only wins by rounding could
 * leave the recomputed sums no better than before. */
#define REFINE_MARGIN 1e-9

typedef struct {
    double cost;
    int idx;
} item;

double vit_balance_cost(int64_t patches, double linear_coef)
{
    double p = (double)patches;
    return p * p + linear_coef * p;
}

/* Cost descending, then index ascending: a total order, so qsort's result is unique. */
static int cmp_desc(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Cost ascending, then index ascending. */
static int cmp_asc(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost < y->cost ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Loads summed afresh in image order, so equal assignments give bitwise equal loads. */
static double max_load_of(const double *cost, const int *assign, int n, int r, double *load)
{
    memset(load, 0, (size_t)r * sizeof *load);
    for (int i = 0; i < n; i++)
        load[assign[i]] += cost[i];
    double mx = 0;
    for (int k = 0; k < r; k++)
        mx = load[k] > mx ? load[k] : mx;
    return mx;
}

static double imbalance_of(double max_load, double total, int r)
{
    return total > 0 ? max_load / (total / r) - 1.0 : 0.0;
}

/* memcpy of n ints; with n == 0 the arrays may be NULL, which memcpy does not allow. */
static void copy_ints(int *dst, const int *src, int n)
{
    if (n > 0)
        memcpy(dst, src, (size_t)n * sizeof *dst);
}

static int count_moved(const int *assign, const int *owner, int n)
{
    int moved = 0;
    for (int i = 0; i < n; i++)
        moved += assign[i] != owner[i];
    return moved;
}

/* (load, rank) order of the min-heap of ranks. */
static int heap_less(const double *load, int a, int b)
{
    return load[a] < load[b] || (load[a] == load[b] && a < b);
}

/* Longest-first: each image, by cost descending, to the least-loaded rank (lowest rank on
 * ties).  heap has room for r ranks. */
static void greedy(const item *order, int n, int r, int *assign, double *load, int *heap)
{
    memset(load, 0, (size_t)r * sizeof *load);
    for (int k = 0; k < r; k++)
        heap[k] = k;   /* all loads 0: rank order is a valid heap */
    for (int t = 0; t < n; t++) {
        int rk = heap[0];
        assign[order[t].idx] = rk;
        load[rk] += order[t].cost;
        /* the top only grew: sift it down */
        int i = 0;
        for (;;) {
            int l = 2 * i + 1, c = i;
            if (l < r && heap_less(load, heap[l], heap[c]))
                c = l;
            if (l + 1 < r && heap_less(load, heap[l + 1], heap[c]))
                c = l + 1;
            if (c == i)
                break;
            int tmp = heap[i];
            heap[i] = heap[c];
            heap[c] = tmp;
            i = c;
        }
    }
}

/* A refinement step: image i moves from the most to the least loaded rank, and image j
 * (swap) the other way; m is the pair's larger load after it, d the load that moves. */
typedef struct {
    double m, d;
    int swap;
    double ci;
    int i, j;
} cand;

static void consider(cand *best, cand c)
{
    int better = c.m < best->m;
    if (c.m == best->m) {
        if (c.d != best->d)
            better = c.d < best->d;
        else if (c.swap != best->swap)
            better = !c.swap;
        else
            better = c.ci > best->ci;
    }
    if (better)
        *best = c;
}

/* Up to `rounds` passes, each the best single move or pairwise swap between the most and
 * the least loaded rank, if it lowers the pair's larger load.  load holds the loads of
 * assign on entry.  hi_list and lo_sorted have room for n entries. */
static void refine(const double *cost, int n, int r, int rounds, int *assign, double *load,
                   int *hi_list, item *lo_sorted)
{
    for (int round = 0; round < rounds; round++) {
        int hi = 0, lo = 0;
        for (int k = 1; k < r; k++) {
            if (load[k] > load[hi])
                hi = k;
            if (load[k] < load[lo])
                lo = k;
        }
        double Lh = load[hi], Ll = load[lo], gap = Lh - Ll;
        if (hi == lo || !(gap > 0))
            return;
        int nh = 0, nl = 0;
        for (int i = 0; i < n; i++) {
            if (assign[i] == hi)
                hi_list[nh++] = i;
            else if (assign[i] == lo)
                lo_sorted[nl++] = (item){cost[i], i};
        }
        qsort(lo_sorted, (size_t)nl, sizeof *lo_sorted, cmp_asc);

        /* The pair's larger load after moving d = c_i (- c_j) from hi to lo is
         * max(Lh - d, Ll + d): V-shaped in d, lowest at gap / 2.  Keep the lowest; ties go
         * to the smaller d, then a move over a swap (fewer images travel), then the larger
         * c_i: all decided by costs, so relabelling the images does not change the pick
         * (only images of equal cost fall back to scan order). */
        /* the bar to beat: a clear drop below Lh (its -inf d lets no tie pass) */
        cand best = {Lh * (1.0 - REFINE_MARGIN), -INFINITY, 1, 0, -1, -1};
        for (int a = 0; a < nh; a++) {
            int i = hi_list[a];
            double d = cost[i];
            consider(&best, (cand){fmax(Lh - d, Ll + d), d, 0, cost[i], i, -1});
        }
        for (int a = 0; a < nh && nl > 0; a++) {
            int i = hi_list[a];
            /* the j whose cost is nearest c_i - gap/2: the first at or above it, and the
             * one before */
            double target = cost[i] - 0.5 * gap;
            int lo_i = 0, hi_i = nl;
            while (lo_i < hi_i) {
                int mid = lo_i + (hi_i - lo_i) / 2;
                if (lo_sorted[mid].cost < target)
                    lo_i = mid + 1;
                else
                    hi_i = mid;
            }
            for (int q = lo_i - 1; q <= lo_i; q++) {
                if (q < 0 || q >= nl)
                    continue;
                double d = cost[i] - lo_sorted[q].cost;
                if (d > 0)
                    consider(&best, (cand){fmax(Lh - d, Ll + d), d, 1, cost[i], i,
                                           lo_sorted[q].idx});
            }
        }
        int bi = best.i, bj = best.j;
        if (bi < 0)
            return;
        assign[bi] = lo;
        load[hi] -= cost[bi];
        load[lo] += cost[bi];
        if (bj >= 0) {
            assign[bj] = hi;
            load[lo] -= cost[bj];
            load[hi] += cost[bj];
        }
    }
}

int vit_balance_assign(const int64_t *patches, const int *owner, int n_images, int n_ranks,
                       double linear_coef, int max_rounds, int *assign, vit_balance_stats *stats,
                       hearth_err *err)
{
    int n = n_images, r = n_ranks;
    if (n < 0 || r < 1 || max_rounds < 0)
        return herr_set(err, HERR_RUNTIME,
                        "ViT balance: bad sizes (%d images, %d ranks, %d rounds)", n, r,
                        max_rounds);
    if (!(linear_coef >= 0) || !isfinite(linear_coef))
        return herr_set(err, HERR_RUNTIME,
                        "ViT balance: the linear cost coefficient must be finite and >= 0, got %g",
                        linear_coef);
    for (int i = 0; i < n; i++) {
        if (owner[i] < 0 || owner[i] >= r)
            return herr_set(err, HERR_RUNTIME,
                            "ViT balance: image %d is owned by rank %d, outside 0..%d", i,
                            owner[i], r - 1);
        if (patches[i] < 0)
            return herr_set(err, HERR_RUNTIME, "ViT balance: image %d has %lld patches", i,
                            (long long)patches[i]);
    }

    vit_balance_stats st = {0, 0, 0, 0};
    size_t nn = n > 0 ? (size_t)n : 1;
    double *cost = calloc(nn, sizeof *cost);
    item *order = malloc(nn * sizeof *order);
    int *alt = malloc(nn * sizeof *alt);
    int *hi_list = malloc(nn * sizeof *hi_list);
    double *load = malloc((size_t)r * sizeof *load);
    int *heap = malloc((size_t)r * sizeof *heap);
    int rc = 0;
    if (!cost || !order || !alt || !hi_list || !load || !heap) {
        rc = herr_set(err, HERR_NOMEM, "ViT balance: out of memory");
        goto out;
    }

    double total = 0;
    for (int i = 0; i < n; i++) {
        cost[i] = vit_balance_cost(patches[i], linear_coef);
        total += cost[i];
    }
    double owner_max = max_load_of(cost, owner, n, r, load);
    st.before = st.after = imbalance_of(owner_max, total, r);
    if (r == 1 || st.before < VIT_BALANCE_SKIP) {
        copy_ints(assign, owner, n);
        st.skipped = 1;
        goto done;
    }

    /* Candidate 1: greedy longest-first, refined (in assign). */
    for (int i = 0; i < n; i++)
        order[i] = (item){cost[i], i};
    qsort(order, (size_t)n, sizeof *order, cmp_desc);
    greedy(order, n, r, assign, load, heap);
    refine(cost, n, r, max_rounds, assign, load, hi_list, order);
    double g_max = max_load_of(cost, assign, n, r, load);
    int g_moved = count_moved(assign, owner, n);

    /* Candidate 2: the owners' assignment, refined (in alt): often nearly as good with far
     * fewer images moved. */
    copy_ints(alt, owner, n);
    max_load_of(cost, alt, n, r, load);
    refine(cost, n, r, max_rounds, alt, load, hi_list, order);
    double o_max = max_load_of(cost, alt, n, r, load);
    int o_moved = count_moved(alt, owner, n);

    double best_max = g_max;
    int best_moved = g_moved;
    if (o_max < g_max || (o_max == g_max && o_moved < g_moved)) {
        copy_ints(assign, alt, n);
        best_max = o_max;
        best_moved = o_moved;
    }
    if (!(best_max < owner_max)) {
        copy_ints(assign, owner, n);
        best_max = owner_max;
        best_moved = 0;
    }
    st.after = imbalance_of(best_max, total, r);
    st.moved = best_moved;

done:
    if (stats)
        *stats = st;
out:
    free(cost);
    free(order);
    free(alt);
    free(hi_list);
    free(load);
    free(heap);
    return rc;
}
