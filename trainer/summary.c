#include "summary.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void summary_init(run_summary *s, int measure_from, const shape_flops *flops)
{
    memset(s, 0, sizeof *s);
    s->measure_from = measure_from;
    if (flops)
        s->flops_model = *flops;
    s->last_loss = NAN;
}

void summary_free(run_summary *s)
{
    free(s->step);
    free(s->step_ms);
    free(s->tokens);
    free(s->flops);
    memset(s, 0, sizeof *s);
}

int summary_add(run_summary *s, const train_step_stats *st, hearth_err *err)
{
    return summary_push(s, st->step, st->step_ms, st->tokens,
                        summary_step_flops(&s->flops_model, st), st->loss, err);
}

int summary_push(run_summary *s, int step, double step_ms, long tokens, double flops,
                 double loss, hearth_err *err)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        int *a = realloc(s->step, (size_t)cap * sizeof *a);
        if (a)
            s->step = a;
        double *b = realloc(s->step_ms, (size_t)cap * sizeof *b);
        if (b)
            s->step_ms = b;
        long *c = realloc(s->tokens, (size_t)cap * sizeof *c);
        if (c)
            s->tokens = c;
        double *d = realloc(s->flops, (size_t)cap * sizeof *d);
        if (d)
            s->flops = d;
        if (!a || !b || !c || !d)
            return herr_set(err, HERR_NOMEM, "summary: out of memory");
        s->cap = cap;
    }
    s->step[s->n] = step;
    s->step_ms[s->n] = step_ms;
    s->tokens[s->n] = tokens;
    s->flops[s->n] = flops;
    s->n++;
    s->last_loss = loss;
    return 0;
}

double summary_step_flops(const shape_flops *f, const train_step_stats *st)
{
    return (double)st->tokens * f->decoder_per_token +
           (double)st->patches * (f->encoder_per_patch + f->projector_per_patch) +
           st->patches_sq * f->encoder_per_patch_sq;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double summary_percentile(const double *sorted, int n, double q)
{
    if (n <= 0)
        return NAN;
    if (q <= 0)
        return sorted[0];
    if (q >= 1)
        return sorted[n - 1];
    double pos = q * (n - 1);
    int lo = (int)floor(pos);
    if (lo >= n - 1)
        return sorted[n - 1];
    double frac = pos - lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

void summary_compute(const run_summary *s, summary_numbers *out)
{
    memset(out, 0, sizeof *out);
    out->steps = s->n;
    out->final_loss = s->last_loss;
    out->step_ms_median = out->step_ms_p10 = out->step_ms_p90 = NAN;
    out->tokens_per_s = out->flops_per_token = NAN;
    int any_measured = 0;
    for (int i = 0; i < s->n; i++)
        any_measured |= s->step[i] >= s->measure_from;
    double *ms = malloc((size_t)(s->n > 0 ? s->n : 1) * sizeof *ms);
    if (!ms)
        return;
    int m = 0;
    double tokens = 0, time_ms = 0, flops = 0;
    for (int i = 0; i < s->n; i++) {
        if (any_measured && s->step[i] < s->measure_from)
            continue;
        ms[m++] = s->step_ms[i];
        tokens += (double)s->tokens[i];
        time_ms += s->step_ms[i];
        flops += s->flops[i];
    }
    out->measured = m;
    if (m > 0) {
        qsort(ms, m, sizeof *ms, cmp_double);
        out->step_ms_median = summary_percentile(ms, m, 0.5);
        out->step_ms_p10 = summary_percentile(ms, m, 0.1);
        out->step_ms_p90 = summary_percentile(ms, m, 0.9);
        if (time_ms > 0)
            out->tokens_per_s = tokens / (time_ms / 1e3);
        if (tokens > 0)
            out->flops_per_token = flops / tokens;
    }
    free(ms);
}
