/* select_fp8.c - selective FP8 policy from layer benchmark rows (select_fp8.h). */
#include "select_fp8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

static const char *const components[] = { "encoder", "projector", "decoder", "experts", NULL };

static int in_list(const char *const *l, const char *s)
{
    for (int i = 0; l[i]; i++)
        if (strcmp(l[i], s) == 0)
            return 1;
    return 0;
}

int select_component_known(const char *name) { return in_list(components, name); }
/* The kinds are the trainer's FP8 linear kinds (shape/fp8_plan.h), one list for both. */
int select_kind_known(const char *name) { return fp8_kind_parse(name) >= 0; }

void select_bench_set_free(select_bench_set *b)
{
    if (b) {
        free(b->rows);
        b->rows = NULL;
        b->n = 0;
    }
}

int select_fp8_parse_allow(const char *list, select_fp8_opts *o, hearth_err *err)
{
    const char *p = list ? list : "";
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n == 7 && strncmp(p, "lm_head", 7) == 0)
            o->allow_lm_head = 1;
        else if (n == 6 && strncmp(p, "router", 6) == 0)
            o->allow_router = 1;
        else if (n == 5 && strncmp(p, "edges", 5) == 0)
            o->allow_edges = 1;
        else if (n)
            return herr_set(err, HERR_CONFIG, "--allow: unknown name '%.*s' (expected a comma "
                            "list of lm_head, router, edges)", (int)n, p);
        p += n + (p[n] == ',');
    }
    return 0;
}

const char *select_fp8_why_text(select_fp8_why w)
{
    switch (w) {
    case FP8_WHY_FASTER: return "fp8: speedup >= threshold";
    case FP8_WHY_SLOWER: return "bf16: speedup below threshold";
    case FP8_WHY_OUT_OF_RANGE: return "bf16: token count outside the measured range";
    case FP8_WHY_EXCLUDED: return "bf16: kept (not in --allow)";
    case FP8_WHY_ERROR: return "bf16: fp8 error above the tolerance";
    }
    return "?";
}

static int row_cmp(const void *a, const void *b)
{
    const select_bench_row *x = a, *y = b;
    int c = strcmp(x->component, y->component);
    if (!c)
        c = strcmp(x->kind, y->kind);
    if (!c)
        c = (x->tp > y->tp) - (x->tp < y->tp);
    if (!c)
        c = (x->tokens > y->tokens) - (x->tokens < y->tokens);
    return c;
}

static int same_group(const select_bench_row *a, const select_bench_row *b)
{
    return strcmp(a->component, b->component) == 0 && strcmp(a->kind, b->kind) == 0 &&
           a->tp == b->tp;
}

static double speedup(const select_bench_row *r) { return r->bf16_ms / r->fp8_ms; }

/* The larger of two errors, where < 0 is unknown (a known error wins). */
static double worse_err(double a, double b) { return a > b ? a : b; }

/* Whether a measured count earns FP8 on its own: fast enough, error within tolerance
 * (or not measured). */
static int row_ok(const select_bench_row *r, const select_fp8_opts *o)
{
    return speedup(r) >= o->threshold && r->fp8_err <= o->max_err;
}

/* Evaluates one group: rows r[0..n) of one (component, kind, tp), sorted by tokens, with
 * distinct token counts (a repeated count keeps its slower fp8 row: conservative). */
static void eval_group(const select_bench_row *r, size_t n, const select_fp8_opts *o,
                       select_fp8_eval *e)
{
    memset(e, 0, sizeof *e);
    snprintf(e->component, sizeof e->component, "%s", r[0].component);
    snprintf(e->kind, sizeof e->kind, "%s", r[0].kind);
    e->tp = r[0].tp;
    e->min_measured = r[0].tokens;
    e->max_measured = r[n - 1].tokens;
    if ((strcmp(e->kind, "lm_head") == 0 && !o->allow_lm_head) ||
        (strcmp(e->kind, "router") == 0 && !o->allow_router)) {
        e->why = FP8_WHY_EXCLUDED;
        return;
    }
    long t = o->tokens;
    if (strcmp(e->component, "encoder") == 0 && o->encoder_tokens > 0)
        t = o->encoder_tokens;
    else if (strcmp(e->component, "projector") == 0 && o->projector_tokens > 0)
        t = o->projector_tokens;
    if (t < r[0].tokens || t > r[n - 1].tokens) {
        e->why = FP8_WHY_OUT_OF_RANGE;
        return;
    }
    size_t j = 0;   /* last measured count <= t */
    while (j + 1 < n && r[j + 1].tokens <= t)
        j++;
    double sj = speedup(&r[j]);
    e->lo_tokens = e->hi_tokens = r[j].tokens;
    e->speedup = sj;
    e->err = r[j].fp8_err;
    if (r[j].tokens < t) {
        double sk = speedup(&r[j + 1]);
        e->hi_tokens = r[j + 1].tokens;
        if (sk < sj)
            e->speedup = sk;
        e->err = worse_err(e->err, r[j + 1].fp8_err);
    }
    if (e->speedup < o->threshold) {
        e->why = FP8_WHY_SLOWER;
        return;
    }
    if (e->err > o->max_err) {
        e->why = FP8_WHY_ERROR;
        return;
    }
    e->why = FP8_WHY_FASTER;
    /* The range around t over which every measured count keeps the threshold and the
     * tolerance; the bracket's counts do (the conservative figures are theirs). */
    size_t lo = j, hi = r[j].tokens < t ? j + 1 : j;
    while (lo > 0 && row_ok(&r[lo - 1], o))
        lo--;
    while (hi + 1 < n && row_ok(&r[hi + 1], o))
        hi++;
    e->min_tokens = r[lo].tokens;
    e->max_tokens = r[hi].tokens;
}

int select_fp8_derive(const select_bench_set *b, const select_fp8_opts *o,
                      select_fp8_policy *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    if (!(o->threshold > 0))
        return herr_set(err, HERR_CONFIG, "--threshold: expected a number > 0");
    if (!(o->max_err > 0))
        return herr_set(err, HERR_CONFIG, "--max-err: expected a number > 0");
    if (o->tokens < 1)
        return herr_set(err, HERR_CONFIG, "the token count must be >= 1");
    select_bench_row *r = malloc((b->n ? b->n : 1) * sizeof *r);
    out->e = malloc((b->n ? b->n : 1) * sizeof *out->e);
    if (!r || !out->e) {
        free(r);
        select_fp8_policy_free(out);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    size_t m = 0;
    for (size_t i = 0; i < b->n; i++)
        if (b->rows[i].bf16_ms > 0 && b->rows[i].fp8_ms > 0)
            r[m++] = b->rows[i];
    qsort(r, m, sizeof *r, row_cmp);
    /* one row per token count: the least favourable to fp8 */
    size_t u = 0;
    for (size_t i = 0; i < m; i++) {
        if (u && same_group(&r[u - 1], &r[i]) && r[u - 1].tokens == r[i].tokens) {
            double e = worse_err(r[u - 1].fp8_err, r[i].fp8_err);
            if (speedup(&r[i]) < speedup(&r[u - 1]))
                r[u - 1] = r[i];
            r[u - 1].fp8_err = e;
            continue;
        }
        r[u++] = r[i];
    }
    for (size_t i = 0; i < u; ) {
        size_t k = i + 1;
        while (k < u && same_group(&r[i], &r[k]))
            k++;
        eval_group(r + i, k - i, o, &out->e[out->n]);
        out->n_rules += out->e[out->n].why == FP8_WHY_FASTER;
        out->n++;
        i = k;
    }
    free(r);
    if (!o->allow_lm_head)
        out->keep_bf16[out->n_keep++] = "lm_head";
    if (!o->allow_router)
        out->keep_bf16[out->n_keep++] = "router";
    if (!o->allow_edges) {
        out->keep_bf16[out->n_keep++] = "decoder.layers.first";
        out->keep_bf16[out->n_keep++] = "decoder.layers.last";
    }
    return 0;
}

void select_fp8_policy_free(select_fp8_policy *p)
{
    free(p->e);
    memset(p, 0, sizeof *p);
}

/* A YAML double-quoted scalar (JSON's escapes are valid YAML). */
static void yaml_str(FILE *f, const char *s)
{
    json_t *j = json_string(s ? s : "");
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    fputs(q ? q : "\"\"", f);
    free(q);
    json_decref(j);
}

char *select_fp8_yaml(const select_bench_set *b, const select_fp8_opts *o,
                      const select_fp8_policy *p)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    fprintf(f, "# Selective FP8 policy written by `hearth select fp8` (docs/select.md).\n"
               "# A linear uses FP8 only where a rule names its component, kind and tp and\n"
               "# the token count lies in [min_tokens, max_tokens]; everything else is bf16.\n");
    fprintf(f, "version: 1\ngpu: ");
    yaml_str(f, b->gpu);
    fprintf(f, "\nmodel: ");
    yaml_str(f, b->model);
    fprintf(f, "\nthreshold: %.17g\nmax_err: %.17g\n# selected for %ld tokens per micro batch",
            o->threshold, o->max_err, o->tokens);
    if (o->encoder_tokens > 0 || o->projector_tokens > 0)
        fprintf(f, " (encoder %ld patches, projector %ld units)", o->encoder_tokens,
                o->projector_tokens);
    fputc('\n', f);
    if (select_fp8_cpu_warning(b))
        fprintf(f, "# measured on the cpu: %s\n", select_fp8_cpu_warning(b));
    fprintf(f, "rules:%s\n", p->n_rules ? "" : " []");
    for (size_t i = 0; i < p->n; i++) {
        const select_fp8_eval *e = &p->e[i];
        if (e->why != FP8_WHY_FASTER)
            continue;
        /* the trainer's components: experts are linears of the decoder */
        const char *comp = strcmp(e->component, "experts") == 0 ? "decoder" : e->component;
        fprintf(f, "  - {component: %s, kind: %s, tp: %d, min_tokens: %ld, max_tokens: %ld, "
                   "measured_speedup: %.4f", comp, e->kind, e->tp, e->min_tokens,
                e->max_tokens, e->speedup);
        if (e->err >= 0)
            fprintf(f, ", measured_err: %.4g", e->err);
        fprintf(f, "}\n");
    }
    fprintf(f, "keep_bf16: [");
    for (int i = 0; i < p->n_keep; i++)
        fprintf(f, "%s%s", i ? ", " : "", p->keep_bf16[i]);
    fprintf(f, "]\n");
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}

static json_t *eval_json(const select_fp8_eval *e)
{
    json_t *o = json_pack("{s:s, s:s, s:i, s:s}", "component", e->component, "kind", e->kind,
                          "tp", e->tp, "verdict", select_fp8_why_text(e->why));
    if (!o)
        return NULL;
    json_object_set_new(o, "measured_tokens", json_pack("[I, I]", (json_int_t)e->min_measured,
                                                        (json_int_t)e->max_measured));
    if (e->why == FP8_WHY_FASTER || e->why == FP8_WHY_SLOWER || e->why == FP8_WHY_ERROR) {
        json_object_set_new(o, "speedup", json_real(e->speedup));
        json_object_set_new(o, "fp8_err", e->err >= 0 ? json_real(e->err) : json_null());
        json_object_set_new(o, "between", json_pack("[I, I]", (json_int_t)e->lo_tokens,
                                                     (json_int_t)e->hi_tokens));
    }
    if (e->why == FP8_WHY_FASTER)
        json_object_set_new(o, "range", json_pack("[I, I]", (json_int_t)e->min_tokens,
                                                  (json_int_t)e->max_tokens));
    return o;
}

char *select_fp8_decision_json(const select_fp8_policy *p)
{
    json_t *rules = json_array(), *keep = json_array();
    for (size_t i = 0; i < p->n; i++)
        if (p->e[i].why == FP8_WHY_FASTER)
            json_array_append_new(rules, json_pack("{s:s, s:s, s:i, s:I, s:I, s:f}",
                                  "component", p->e[i].component, "kind", p->e[i].kind,
                                  "tp", p->e[i].tp, "min_tokens", (json_int_t)p->e[i].min_tokens,
                                  "max_tokens", (json_int_t)p->e[i].max_tokens,
                                  "measured_speedup", p->e[i].speedup));
    for (int i = 0; i < p->n_keep; i++)
        json_array_append_new(keep, json_string(p->keep_bf16[i]));
    json_t *o = json_pack("{s:s, s:o, s:o}", "fp8", p->n_rules ? "selective" : "off",
                          "rules", rules, "keep_bf16", keep);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return s;
}

char *select_fp8_evidence_json(const select_bench_set *b, const select_fp8_opts *o,
                               const select_fp8_policy *p)
{
    json_t *groups = json_array();
    for (size_t i = 0; i < p->n; i++)
        json_array_append_new(groups, eval_json(&p->e[i]));
    json_t *ev = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:f, s:f, s:I, s:o}", "gpu",
                           b->gpu, "model", b->model, "cuda", b->cuda, "cublaslt", b->cublaslt,
                           "device", b->device, "build", b->build, "date", b->date,
                           "threshold", o->threshold, "max_err", o->max_err, "tokens",
                           (json_int_t)o->tokens, "groups", groups);
    char *s = ev ? json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(ev);
    return s;
}

const char *select_fp8_cpu_warning(const select_bench_set *b)
{
    if (strcmp(b->device, "cpu") != 0 && strcmp(b->gpu, "cpu") != 0)
        return NULL;
    return "these layer benchmarks ran on the cpu (the fp32 reference against the FP8 "
           "emulation): their speedups say nothing about a GPU";
}

int select_fp8_plan(const select_fp8_policy *p, fp8_plan *out, hearth_err *err)
{
    memset(out, 0, sizeof *out);
    out->history = FP8_DEFAULT_HISTORY;
    out->rules = calloc(p->n_rules + 1, sizeof *out->rules);
    out->keep = calloc((size_t)p->n_keep + 1, sizeof *out->keep);
    if (!out->rules || !out->keep) {
        fp8_plan_clear(out);
        return herr_set(err, HERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < p->n; i++) {
        const select_fp8_eval *e = &p->e[i];
        if (e->why != FP8_WHY_FASTER)
            continue;
        /* as the policy file writes them: the experts are linears of the decoder */
        int comp = strcmp(e->component, "experts") == 0 ? FP8_COMP_DECODER
                                                        : fp8_comp_parse(e->component);
        out->rules[out->n_rules++] = (fp8_rule){ comp, fp8_kind_parse(e->kind), e->tp,
                                                 e->min_tokens, e->max_tokens, e->speedup };
    }
    for (int i = 0; i < p->n_keep; i++)
        if (fp8_keep_parse(p->keep_bf16[i], &out->keep[out->n_keep++])) {
            fp8_plan_clear(out);
            return herr_set(err, HERR_RUNTIME, "keep_bf16: %s is no name", p->keep_bf16[i]);
        }
    return 0;
}
