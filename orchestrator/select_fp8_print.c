/* select_fp8_print.c - the evidence of an FP8 policy as a table (select_fp8.h): what
 * `hearth select fp8` prints and what the plan prints for `precision.fp8: auto`. */
#include "select_fp8.h"

void select_fp8_print(const select_bench_set *b, const select_fp8_opts *o,
                      const select_fp8_policy *p, const char *indent, FILE *f)
{
    fprintf(f, "%slayer benchmarks: %s on %s (device %s, build %s, measured %s; cuda %s, "
               "cublasLt %s), %zu rows; %ld tokens, threshold %.3g, max error %.3g\n",
            indent, b->model, b->gpu, b->device[0] ? b->device : "?",
            b->build[0] ? b->build : "?", b->date[0] ? b->date : "?",
            b->cuda[0] ? b->cuda : "?", b->cublaslt[0] ? b->cublaslt : "?", b->n, o->tokens,
            o->threshold, o->max_err);
    fprintf(f, "%s%-10s %-11s %3s %9s %9s %-17s %s\n", indent, "component", "kind", "tp",
            "speedup", "fp8_err", "measured between", "verdict");
    for (size_t i = 0; i < p->n; i++) {
        const select_fp8_eval *e = &p->e[i];
        char sp[32] = "-", er[32] = "-", between[40] = "-";
        if (e->why == FP8_WHY_FASTER || e->why == FP8_WHY_SLOWER || e->why == FP8_WHY_ERROR) {
            snprintf(sp, sizeof sp, "%.3f", e->speedup);
            snprintf(er, sizeof er, e->err >= 0 ? "%.3g" : "unknown", e->err);
            snprintf(between, sizeof between, "%ld..%ld", e->lo_tokens, e->hi_tokens);
        } else {
            snprintf(between, sizeof between, "(%ld..%ld)", e->min_measured, e->max_measured);
        }
        fprintf(f, "%s%-10s %-11s %3d %9s %9s %-17s %s\n", indent, e->component, e->kind,
                e->tp, sp, er, between, select_fp8_why_text(e->why));
    }
}
