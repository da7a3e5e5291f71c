/* bench_plan.c - times the orchestrator's planning path on large sweeps:
 *   1. expansion alone over a 1M-point matrix (6 keys x 10 values);
 *   2. expansion + where over the same matrix;
 *   3. expansion + where + validity (resolve each point, run the layout rules): the
 *      `hearth plan` path without hashing (target: < 1 s for 1M points);
 *   4. validity of every one of the 1M points (no where to thin them out);
 *   5. resolve + hash (+ dedup against an empty result set) for 100k points.
 * The DB-backed dedup is timed by the results-database benchmarks.
 *
 * Usage: bench_plan            (uses the tiny-vlm preset from contrib/models)
 * Exit status 1 when a stage fails or gives counts that do not add up. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "expand.h"
#include "plan.h"
#include "spec.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const big_spec =
    "name: bench-1m\n"
    "base: {model: tiny-vlm, train: {seq_len: 64}}\n"
    "matrix:\n"
    "  ranks: [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]\n"
    "  parallel.tp: [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]\n"
    "  parallel.pp: [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]\n"
    "  train.micro_batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
    "  train.lr: [1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4, 7e-4, 8e-4, 9e-4, 1e-3]\n"
    "  train.seed: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n"
    "where: parallel.tp * parallel.pp <= ranks\n";

static const char *const hash_spec =
    "name: bench-100k\n"
    "base: {model: tiny-vlm, ranks: 4, parallel: {tp: 2}, train: {seq_len: 64}}\n"
    "matrix:\n"
    "  train.seed: [%s]\n"
    "  train.lr: [1e-4, 2e-4, 3e-4, 4e-4, 5e-4, 6e-4, 7e-4, 8e-4, 9e-4, 1e-3]\n";

typedef struct {
    const char *stage;
    uint64_t points;
    double seconds;
    const char *note;
} row;

static int load(spec **s, const char *text, hearth_err *err)
{
    return spec_parse(s, "bench.yaml", text, strlen(text), err);
}

static int no_runs(void *ctx, const char *hash, int *count, hearth_err *err)
{
    (void)ctx;
    (void)hash;
    (void)err;
    *count = 0;
    return 0;
}

int main(void)
{
    hearth_err err = {{0}};
    spec *s = NULL;
    row rows[5];
    int n_rows = 0, status = 0;
    char notes[4][160];

    if (load(&s, big_spec, &err)) {
        fprintf(stderr, "bench_plan: %s\n", err.msg);
        return 1;
    }
    /* 1. expansion alone: the same spec without where */
    expr_node *where = s->where;
    s->where = NULL;
    expand_iter *it = NULL;
    expand_point pt;
    double t0 = now_s();
    uint64_t n = 0;
    if (expand_create(&it, s, NULL, NULL, &err))
        goto fail;
    int rc;
    while ((rc = expand_next(it, &pt, &err)) == 1)
        n++;
    expand_free(it);
    if (rc)
        goto fail;
    rows[n_rows++] = (row){"expand 1M", n, now_s() - t0, "10^6 candidates"};
    if (n != 1000000)
        status = 1;

    /* 2. expansion + where (keys read from the point) */
    s->where = where;
    t0 = now_s();
    n = 0;
    if (expand_create(&it, s, NULL, NULL, &err))
        goto fail;
    while ((rc = expand_next(it, &pt, &err)) == 1)
        n++;
    expand_stats st;
    expand_get_stats(it, &st);
    expand_free(it);
    if (rc)
        goto fail;
    snprintf(notes[0], sizeof notes[0], "%" PRIu64 " of %" PRIu64 " pass where", n,
             st.candidates);
    rows[n_rows++] = (row){"expand + where", n, now_s() - t0, notes[0]};

    /* 3. + validity: resolve every point and check the layout rules */
    plan_opts opts = { .no_hash = 1 };
    plan_counts c;
    t0 = now_s();
    if (plan_run(s, &opts, NULL, NULL, &c, &err))
        goto fail;
    double t_plan = now_s() - t0;
    snprintf(notes[1], sizeof notes[1], "%" PRIu64 " valid, %" PRIu64 " pruned; target < 1 s",
             c.kept, c.pruned);
    rows[n_rows++] = (row){"expand + where + validity", c.points, t_plan, notes[1]};
    if (c.points != n || c.kept + c.pruned != c.points)
        status = 1;

    /* 4. validity of all 1M points */
    s->where = NULL;
    t0 = now_s();
    rc = plan_run(s, &opts, NULL, NULL, &c, &err);
    s->where = where;
    if (rc)
        goto fail;
    snprintf(notes[3], sizeof notes[3], "%" PRIu64 " valid, %" PRIu64 " pruned", c.kept,
             c.pruned);
    rows[n_rows++] = (row){"expand + validity (all)", c.points, now_s() - t0, notes[3]};
    if (c.points != 1000000)
        status = 1;
    spec_free(s);
    s = NULL;

    /* 4. resolve + hash + (empty) dedup over 100k distinct valid points */
    size_t cap = 100000;
    char *seeds = malloc(cap), *text = malloc(cap + 1024);
    if (!seeds || !text) {
        free(seeds);
        free(text);
        fprintf(stderr, "bench_plan: out of memory\n");
        return 1;
    }
    size_t used = 0;
    for (int i = 0; i < 10000; i++)
        used += (size_t)snprintf(seeds + used, cap - used, "%s%d", i ? ", " : "", i + 1);
    snprintf(text, cap + 1024, hash_spec, seeds);
    rc = load(&s, text, &err);
    free(seeds);
    free(text);
    if (rc)
        goto fail;
    plan_opts hopts = { .already_completed = no_runs };
    t0 = now_s();
    if (plan_run(s, &hopts, NULL, NULL, &c, &err))
        goto fail;
    snprintf(notes[2], sizeof notes[2], "%" PRIu64 " kept, %" PRIu64 " duplicates", c.kept,
             c.skipped);
    rows[n_rows++] = (row){"resolve + hash + dedup", c.points, now_s() - t0, notes[2]};
    if (c.points != 100000 || c.kept != 100000)
        status = 1;
    spec_free(s);

    printf("%-28s %10s %10s %10s  %s\n", "stage", "points", "seconds", "ns/point", "note");
    for (int i = 0; i < n_rows; i++)
        printf("%-28s %10" PRIu64 " %10.3f %10.0f  %s\n", rows[i].stage, rows[i].points,
               rows[i].seconds,
               rows[i].points ? 1e9 * rows[i].seconds / (double)rows[i].points : 0.0,
               rows[i].note);
    if (status)
        fprintf(stderr, "bench_plan: counts do not add up\n");
    return status;
fail:
    fprintf(stderr, "bench_plan: %s\n", err.msg);
    spec_free(s);
    return 1;
}
