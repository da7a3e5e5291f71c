/* select.h - what `hearth select fp8|encoder`, `hearth bench` and `auto` values in specs
 * share: layer benchmark rows (docs/select.md, "layer_bench.json") and the names of
 * components and linear kinds. */
#ifndef HEARTH_SELECT_H
#define HEARTH_SELECT_H

#include <stddef.h>

/* One measured linear: forward + backward, median of `repeats` timed runs, fp8 with its
 * quantisation included. */
typedef struct {
    char component[16];     /* encoder | projector | decoder | experts */
    char kind[16];          /* qkv | proj | fc1 | fc2 | expert_fc1 | expert_fc2 | lm_head | router */
    int tp;
    long tokens;
    double bf16_ms, fp8_ms;
    int repeats;
    double fp8_err;         /* the FP8 results' relative error to the baseline; < 0: not
                               measured (files from before the field) */
} select_bench_row;

/* A set of rows from one layer_bench.json: one GPU, one model, one software stack. */
typedef struct {
    char gpu[128];
    char model[256];
    char cuda[64], cublaslt[64];   /* "" when unknown */
    char device[8];                /* "cpu" | "cuda" | "" (unknown: older files) */
    char build[128];               /* the trainer build that measured it, "" unknown */
    char date[40];                 /* when it was measured (ISO 8601 UTC), "" unknown */
    size_t n;
    select_bench_row *rows;        /* malloc'd */
} select_bench_set;

void select_bench_set_free(select_bench_set *b);

/* Whether a name is a known component / linear kind (the layer_bench table's checks). */
int select_component_known(const char *name);
int select_kind_known(const char *name);

#endif
